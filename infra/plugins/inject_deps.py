"""Put the installed Python dependencies into each function's zip (called by sluice-packaging.js).

Reads a JSON spec on stdin: the installed site-packages folder, names never to ship
(``noDeploy``), the HTTP-only distributions and paths, and each function's artifact with
whether it is an HTTP function. Each zip is rewritten with its own entries (less the
HTTP-only paths for non-HTTP functions) plus the dependencies it needs. zlib in C keeps
this to a second or so per function, where JSZip took half a minute.
"""

from __future__ import annotations

import json
import os
import re
import sys
import zipfile
from pathlib import Path


def _norm(name: str) -> str:
    return re.sub(r"[-.]+", "_", name.lower())


def _belongs(top: str, name: str) -> bool:
    if top in (name, f"{name}.py"):
        return True
    return top.endswith((".dist-info", ".egg-info")) and _norm(top.split("-", 1)[0]) == _norm(name)


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


def main() -> int:
    spec = json.load(sys.stdin)
    root = Path(spec["installed"]).resolve()
    http_only = [n for n in spec["httpOnly"] if "/" not in n]
    http_paths = {n for n in spec["httpOnly"] if "/" in n}
    common: list[tuple[Path, str]] = []
    http: list[tuple[Path, str]] = []
    for top in sorted(os.listdir(root)):
        if top.startswith(".") or top in ("__pycache__", "bin", "requirements.txt"):
            continue
        if any(_belongs(top, n) for n in spec["noDeploy"]):
            continue
        (http if any(_belongs(top, n) for n in http_only) else common).extend(_files(root, top))
    data = {rel: full.read_bytes() for full, rel in common + http}
    for fn in spec["functions"]:
        artifact = Path(fn["artifact"])
        with zipfile.ZipFile(artifact) as source:
            own = [(info, source.read(info)) for info in source.infolist()
                   if fn["http"] or info.filename not in http_paths]
        tmp = artifact.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as target:
            for info, content in own:
                target.writestr(info, content)
            for _, rel in common + (http if fn["http"] else []):
                info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                target.writestr(info, data[rel])
        tmp.replace(artifact)
        print(f"{fn['name']}: {len(own)} own entries, "
              f"{len(common) + (len(http) if fn['http'] else 0)} dependency files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
