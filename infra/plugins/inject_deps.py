"""Put the installed Python dependencies into each function's zip (called by sluice-packaging.js).

Reads a JSON spec on stdin: the installed site-packages folder, distributions never to
ship (``noDeploy``), paths no function loads (``neverShipped``), the distributions and
paths only some kinds of function load (``only``: each entry's ``handlers`` and
``ship``), and each function's artifact with its kind (its handler's module file:
``http``, ``cron``, ``consumers``). A distribution's files are the ones its ``RECORD``
lists (``cffi`` is also ``_cffi_backend*.so``; ``pyyaml`` is ``yaml/``). Each zip is
rewritten with its own entries plus the dependencies it needs, less what it does not;
zlib in C keeps this to a second or so per function, where JSZip took half a minute. When run by the
runtime's Python version (``bytecode`` in the spec), every module also gets its
unchecked-hash ``.pyc``: Lambda's read-only filesystem cannot cache bytecode, so without
it each cold start would compile every module it imports.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import sys
import zipfile
from importlib import _bootstrap_external  # type: ignore[attr-defined]
from pathlib import Path


def _norm(name: str) -> str:
    return re.sub(r"[-.]+", "_", name.lower())


def _owners(root: Path) -> dict[str, str]:
    """Each installed top-level entry's distribution (normalised), from the RECORD files."""
    owner: dict[str, str] = {}
    for info in root.glob("*.dist-info"):
        dist = _norm(info.name.split("-", 1)[0])  # name-version.dist-info, "-" escaped in both
        record = info / "RECORD"
        lines = record.read_text().splitlines() if record.exists() else []
        for line in lines:
            top = line.split(",", 1)[0].split("/", 1)[0]
            if top and not top.startswith(".."):
                owner.setdefault(top, dist)
    return owner


def _named(rel: str, names: set[str]) -> bool:
    """A name ending in ``/`` is a folder and everything under it (``*/tests/``: a
    ``tests`` folder in any package); any other is a file or a glob (``*.pyi``)."""
    folders = [rel[:i + 1] for i, c in enumerate(rel) if c == "/"]
    return any(any(fnmatch.fnmatchcase(f, name) for f in folders) if name.endswith("/")
               else fnmatch.fnmatchcase(rel, name) for name in names)


def _rooted(info: zipfile.ZipInfo, source_root: str) -> zipfile.ZipInfo:
    """The package's source root (``shared/``) is not part of its import path: the zip holds
    ``shared/sluice/x.py`` as ``sluice/x.py``, where Lambda's ``/var/task`` finds it."""
    if source_root and info.filename.startswith(source_root):
        info.filename = info.filename[len(source_root):]
    return info


def _files(root: Path, top: str) -> list[tuple[Path, str]]:
    path = root / top
    if path.is_file():
        return [(path, top)]
    found = []
    for dirpath, dirnames, filenames in os.walk(path, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for filename in sorted(filenames):
            full = Path(dirpath) / filename
            found.append((full, full.relative_to(root).as_posix()))
    return found


def _pyc(rel: str, source: bytes) -> tuple[str, bytes] | None:
    """``rel``'s bytecode for this interpreter, as an unchecked-hash .pyc: a read-only Lambda
    filesystem cannot cache bytecode, so without it every cold start compiles every module."""
    try:
        code = compile(source, rel, "exec", dont_inherit=True)
    except SyntaxError:  # e.g. a vendored Python 2 file that is never imported
        return None
    folder, _, name = rel.rpartition("/")
    tag = sys.implementation.cache_tag
    target = f"{folder}/__pycache__/{name[:-3]}.{tag}.pyc" if folder else f"__pycache__/{name[:-3]}.{tag}.pyc"
    pyc = _bootstrap_external._code_to_hash_pyc(code, importlib.util.source_hash(source), False)
    return target, bytes(pyc)


def _kinds(only: list[dict[str, list[str]]]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``only`` as two maps: distribution -> kinds that ship it, path -> kinds that ship it."""
    dists: dict[str, set[str]] = {}
    paths: dict[str, set[str]] = {}
    for entry in only:
        for name in entry["ship"]:
            into = paths if "/" in name else dists
            key = name if "/" in name else _norm(name)
            into.setdefault(key, set()).update(entry["handlers"])
    return dists, paths


def _ships(rel: str, kind: str, paths: dict[str, set[str]]) -> bool:
    return all(kind in kinds for path, kinds in paths.items() if _named(rel, {path}))


def main() -> int:
    spec = json.load(sys.stdin)
    root = Path(spec["installed"]).resolve()
    dists, paths = _kinds(spec["only"])
    never = set(spec["neverShipped"])
    no_deploy = {_norm(n) for n in spec["noDeploy"]}
    bytecode = bool(spec.get("bytecode"))
    source_root = spec.get("sourceRoot", "")
    if bytecode:
        want = tuple(int(n) for n in spec["runtime"].removeprefix("python").split("."))
        if sys.version_info[:2] != want:
            raise SystemExit(f"bytecode for {spec['runtime']} needs that Python, not {sys.version}")

    owners = _owners(root)
    data: dict[str, bytes] = {}
    deps: list[tuple[str, set[str] | None]] = []  # each file, and the kinds it ships with
    for top in sorted(os.listdir(root)):
        if top.startswith(".") or top in ("__pycache__", "bin", "requirements.txt"):
            continue
        dist = owners.get(top, _norm(top.split("-", 1)[0].removesuffix(".py")))
        if dist in no_deploy:
            continue
        for full, rel in _files(root, top):
            if _named(rel, never):
                continue
            data[rel] = full.read_bytes()
            deps.append((rel, dists.get(dist)))
            if bytecode and rel.endswith(".py") and (pyc := _pyc(rel, data[rel])) is not None:
                data[pyc[0]] = pyc[1]
                deps.append((pyc[0], dists.get(dist)))

    for fn in spec["functions"]:
        artifact, kind = Path(fn["artifact"]), fn["kind"]
        with zipfile.ZipFile(artifact) as source:
            own = [(_rooted(info, source_root), source.read(info))
                   for info in source.infolist()]
        own = [(info, content) for info, content in own
               if _ships(info.filename, kind, paths) and not _named(info.filename, never)]
        own_pyc = [pyc for info, content in own if bytecode and info.filename.endswith(".py")
                   and (pyc := _pyc(info.filename, content)) is not None]
        shipped = [rel for rel, kinds in deps if kinds is None or kind in kinds]
        size = sum(len(c) for _, c in own) + sum(len(c) for _, c in own_pyc) \
            + sum(len(data[rel]) for rel in shipped)
        tmp = artifact.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as target:
            for info, content in own:
                target.writestr(info, content)
            for rel, content in own_pyc + [(rel, data[rel]) for rel in shipped]:
                info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                target.writestr(info, content)
        tmp.replace(artifact)
        print(f"{fn['name']}: {len(own)} own entries, {len(shipped)} dependency files, "
              f"{size / 1e6:.1f} MB unpacked, {artifact.stat().st_size / 1e6:.1f} MB zipped"
              f"{', with ' + sys.implementation.cache_tag + ' bytecode' if bytecode else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
