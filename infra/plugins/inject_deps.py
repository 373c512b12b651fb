"""Put the installed Python dependencies into each function's zip (called by sluice-packaging.js).

Reads a JSON spec on stdin: the installed site-packages folder, names never to ship
(``noDeploy``), the HTTP-only distributions and paths, and each function's artifact with
whether it is an HTTP function. Each zip is rewritten with its own entries (less the
HTTP-only paths for non-HTTP functions) plus the dependencies it needs. zlib in C keeps
this to a second or so per function, where JSZip took half a minute. When run by the
runtime's Python version (``bytecode`` in the spec), every module also gets its
unchecked-hash ``.pyc``: Lambda's read-only filesystem cannot cache bytecode, so without
it each cold start would compile every module it imports.
"""

from __future__ import annotations

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


def _belongs(top: str, name: str) -> bool:
    if top in (name, f"{name}.py"):
        return True
    return top.endswith((".dist-info", ".egg-info")) and _norm(top.split("-", 1)[0]) == _norm(name)


def _http_path(filename: str, http_paths: set[str]) -> bool:
    """A path entry ending in ``/`` names a whole folder (``sluice/http/``)."""
    return any(filename == p or (p.endswith("/") and filename.startswith(p)) for p in http_paths)


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


def main() -> int:
    spec = json.load(sys.stdin)
    root = Path(spec["installed"]).resolve()
    http_only = [n for n in spec["httpOnly"] if "/" not in n]
    http_paths = {n for n in spec["httpOnly"] if "/" in n}
    bytecode = bool(spec.get("bytecode"))
    source_root = spec.get("sourceRoot", "")
    if bytecode:
        want = tuple(int(n) for n in spec["runtime"].removeprefix("python").split("."))
        if sys.version_info[:2] != want:
            raise SystemExit(f"bytecode for {spec['runtime']} needs that Python, not {sys.version}")

    data: dict[str, bytes] = {}
    common: list[str] = []
    http: list[str] = []
    for top in sorted(os.listdir(root)):
        if top.startswith(".") or top in ("__pycache__", "bin", "requirements.txt"):
            continue
        if any(_belongs(top, n) for n in spec["noDeploy"]):
            continue
        bucket = http if any(_belongs(top, n) for n in http_only) else common
        for full, rel in _files(root, top):
            data[rel] = full.read_bytes()
            bucket.append(rel)
            if bytecode and rel.endswith(".py") and (pyc := _pyc(rel, data[rel])) is not None:
                data[pyc[0]] = pyc[1]
                bucket.append(pyc[0])

    for fn in spec["functions"]:
        artifact = Path(fn["artifact"])
        with zipfile.ZipFile(artifact) as source:
            own = [(_rooted(info, source_root), source.read(info))
                   for info in source.infolist()]
        own = [(info, content) for info, content in own
               if fn["http"] or not _http_path(info.filename, http_paths)]
        own_pyc = [pyc for info, content in own if bytecode and info.filename.endswith(".py")
                   and (pyc := _pyc(info.filename, content)) is not None]
        deps = common + (http if fn["http"] else [])
        tmp = artifact.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as target:
            for info, content in own:
                target.writestr(info, content)
            for rel, content in own_pyc + [(rel, data[rel]) for rel in deps]:
                info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                target.writestr(info, content)
        tmp.replace(artifact)
        print(f"{fn['name']}: {len(own)} own entries, {len(deps)} dependency files"
              f"{', with ' + sys.implementation.cache_tag + ' bytecode' if bytecode else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
