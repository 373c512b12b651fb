"""Each function's cold start as its zip will have it: ``sluice generate --check``.

Every function of a deployment's ``serverless.yml`` is imported in a fresh interpreter
(``python -I -S``), with the environment the file gives it and stand-in secrets, the way
the packaged function starts on Lambda: its handler module runs its init (the job or topic
it names is looked up, the extension modules are imported, the channel table is merged).
What the interpreter sees is what the zip holds: the deployment folder first (its package
patterns ship the app's packages from there), then every folder this interpreter imports
from, less ``.pth`` files and less the distribution metadata that declares
``sluice.extensions`` entry points, which no zip carries. So an app found here only by its
entry point, and not by the ``SLUICE_APP`` line, fails here as it would on Lambda.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from sluice.core.extensions import GROUP

PROBE = """
import importlib, json, sys
paths, module, attr = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
sys.path[:0] = paths
try:
    getattr(importlib.import_module(module), attr)
    from sluice.delivery.channels import channels
    channels()
except BaseException as exc:
    print(json.dumps(f"{type(exc).__name__}: {exc}"))
else:
    print(json.dumps(None))
"""
TIMEOUT_S = 120


class ColdStart(NamedTuple):
    function: str
    handler: str
    error: str | None  # None: the handler imported and found what it names


def functions(serverless: str) -> dict[str, dict[str, Any]]:
    """The ``functions`` of a serverless.yml text, each with ``environment`` merged over
    ``provider.environment`` (values that are Serverless variables left out)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # !GetAtt, ...
    data = yaml.load(serverless, Loader=Loader) or {}
    provider = (data.get("provider") or {}).get("environment") or {}
    found: dict[str, dict[str, Any]] = {}
    for name, fn in (data.get("functions") or {}).items():
        env = {**provider, **(fn.get("environment") or {})}
        found[name] = {"handler": str(fn.get("handler", "")), "environment": {
            k: str(v) for k, v in env.items() if v is not None and "${" not in str(v)}}
    return found


def _stdlib() -> set[Path]:
    paths = sysconfig.get_paths()
    lib = Path(paths["platstdlib"])
    found = {Path(paths["stdlib"]), lib, lib / "lib-dynload",
             Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}{sys.version_info[1]}.zip"}
    return {p.resolve() for p in found}


def _declares_extensions(info: Path) -> bool:
    entry_points = info / "entry_points.txt"
    return entry_points.is_file() and f"[{GROUP}]" in entry_points.read_text(errors="replace")


def _mirror(folder: Path, into: Path) -> Path:
    """``folder`` as a zip would hold it: every entry but ``.pth`` files and the metadata of
    a distribution with ``sluice.extensions`` entry points."""
    into.mkdir(parents=True)
    for entry in folder.iterdir():
        if entry.suffix == ".pth" or (entry.suffix in (".dist-info", ".egg-info")
                                      and _declares_extensions(entry)):
            continue
        (into / entry.name).symlink_to(entry)
    return into


def search_path(root: Path, scratch: Path) -> list[str]:
    """The probe's ``sys.path`` in front of its standard library (see the module's doc)."""
    stdlib, found = _stdlib(), [str(root)]
    seen = {root.resolve()}
    for n, entry in enumerate(sys.path):
        folder = Path(entry or os.getcwd()).resolve()
        if folder in seen or folder in stdlib or not folder.is_dir():
            continue
        seen.add(folder)
        found.append(str(_mirror(folder, scratch / f"path{n}")))
    own = Path(__file__).resolve().parents[2]  # the folder holding sluice/; for an editable
    # install's finder it is not in sys.path, and .pth files are skipped
    if own not in seen:
        found.append(str(own))
    return found


def _environment(scratch: Path, fn_env: Mapping[str, str]) -> dict[str, str]:
    stand_in = secrets.token_urlsafe(32)
    return {
        "PATH": os.environ.get("PATH", ""), "HOME": str(scratch),
        "PYTHONDONTWRITEBYTECODE": "1",
        # no AWS call belongs in an init: any would fail against this closed port
        "AWS_ACCESS_KEY_ID": "probe", "AWS_SECRET_ACCESS_KEY": "probe",
        "AWS_REGION": "eu-north-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "SLUICE_DATABASE_URL": f"sqlite:///{scratch / 'probe.db'}",
        "SLUICE_QUEUE_SIGNING_SECRET": stand_in, "CRON_SECRET": stand_in,
        **fn_env,
    }


def _start(name: str, fn: dict[str, Any], paths: list[str], scratch: Path) -> ColdStart:
    module, _, attr = fn["handler"].rpartition(".")
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", PROBE, json.dumps(paths),
             module.replace("/", "."), attr],
            env=_environment(scratch, fn["environment"]), cwd=scratch, capture_output=True,
            text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return ColdStart(name, fn["handler"], f"no answer in {TIMEOUT_S} s")
    lines = done.stdout.strip().splitlines()
    try:
        error: str | None = json.loads(lines[-1]) if lines else None
    except ValueError:
        error = lines[-1]
    if done.returncode != 0 or not lines:
        error = error or f"exit {done.returncode}: {done.stderr.strip()[-500:]}"
    return ColdStart(name, fn["handler"], error)


def cold_starts(root: Path) -> list[ColdStart]:
    """Each function of ``root``'s serverless.yml, started as its zip will start it."""
    found = functions((root / "serverless.yml").read_text())
    with tempfile.TemporaryDirectory(prefix="sluice-probe-") as tmp:
        scratch = Path(tmp)
        paths = search_path(root, scratch)
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            return list(pool.map(lambda item: _start(item[0], item[1], paths, scratch),
                                 found.items()))
