"""Cold start per Lambda function: its handler module's import-and-init time in fresh
interpreters, next to the import time of the libraries that handler truly loads.

For each function in serverless.yml, a fresh interpreter imports the handler module
(module-scope init included: settings, services, the job's drain) with the function's
environment and reports the time and every module the import added. Another fresh
interpreter then imports just those modules (submodules included, in the same order),
less Sluice's own (``shared``, ``functions``): that is the floor no handler built on
these libraries could beat.
Times are the child's CPU time (``time.process_time``), so other work on a shared
machine does not swell them; medians over ``SLUICE_BENCH_REPEAT`` (default 7) runs each.

A row's ratio is libraries / handler (>1 would mean faster than its own libraries); the
target is a ratio of at least 1/1.15 = 0.87, and the note gives each function's time as
a share of the HTTP function's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.common import Row, median, row

ROOT = Path(__file__).resolve().parent.parent
OWN = ("shared", "functions", "bench", "tests")

HANDLER = """
import importlib, json, sys, time
module, attr = sys.argv[1], sys.argv[2]
before = set(sys.modules)
start = time.process_time()
getattr(importlib.import_module(module), attr)
elapsed = time.process_time() - start
added = [m for m in sys.modules if m not in before]
print(json.dumps({"seconds": elapsed, "added": added}))
"""

LIBRARIES = """
import importlib, json, sys, time
names = json.loads(sys.argv[1])
start = time.process_time()
for name in names:
    try:
        importlib.import_module(name)
    except Exception:  # a module that only exists as a side effect of another import
        pass
print(json.dumps({"seconds": time.process_time() - start}))
"""


def _functions() -> dict[str, dict[str, Any]]:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    data = yaml.load((ROOT / "serverless.yml").read_text(), Loader=Loader)
    functions: dict[str, dict[str, Any]] = data["functions"]
    return functions


def _env(fn: dict[str, Any], workdir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLUICE_", "CRON_", "AWS_", "POLAR_", "SENTRY_", "PYTHON"))}
    env.update({
        "SLUICE_STAGE": "bench",
        "SLUICE_DATABASE_URL": f"sqlite:///{workdir}/sluice.db",
        "SLUICE_QUEUE_MODE": "sqs",
        "SLUICE_QUEUE_PREFIX": "sluice-bench-",
        "CRON_SECRET": "bench-cron-secret-0123456789",
        "SLUICE_QUEUE_SIGNING_SECRET": "bench-signing-secret-0123456789",
        "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "eu-north-1", "AWS_DEFAULT_REGION": "eu-north-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "PYTHONDONTWRITEBYTECODE": "",
        **{k: str(v) for k, v in (fn.get("environment") or {}).items()},
    })
    return env


def _child(code: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]}: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(fn: dict[str, Any], repeat: int, workdir: str) -> tuple[float, float, list[str]]:
    module, _, attr = fn["handler"].rpartition(".")
    module = module.replace("/", ".")
    env = _env(fn, workdir)
    _child(HANDLER, [module, attr], env)  # warm the bytecode cache, as a deployed zip has it
    handler_runs, library_runs = [], []
    libraries: list[str] = []
    for _ in range(repeat):
        probe = _child(HANDLER, [module, attr], env)
        handler_runs.append(probe["seconds"])
        libraries = [m for m in probe["added"]
                     if m.split(".")[0] not in OWN and not m.startswith("__")]
        library_runs.append(_child(LIBRARIES, [json.dumps(libraries)], env)["seconds"])
    return median(handler_runs), median(library_runs), libraries


def run() -> list[Row]:
    repeat = int(os.environ.get("SLUICE_BENCH_REPEAT", "7"))
    measured: dict[str, tuple[float, float, list[str]]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for name, fn in _functions().items():
            measured[name] = measure(fn, repeat, workdir)
    http = next((measured[n][0] for n, fn in _functions().items()
                 if any("httpApi" in e for e in fn.get("events") or [])), None)
    rows = []
    for name, (handler_s, libraries_s, libraries) in measured.items():
        third_party = {m.split(".")[0] for m in libraries} - set(sys.stdlib_module_names)
        share = f"{handler_s / http:.0%} of http; " if http else ""
        rows.append(row(f"coldstart {name}", handler_s * 1000, libraries_s * 1000, "ms",
                        higher_is_better=False,
                        note=f"{share}libs: {', '.join(sorted(third_party)) or 'stdlib only'}"))
    return rows
