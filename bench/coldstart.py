"""Cold start per Lambda function as packaged: its handler module's import-and-init time in
fresh interpreters of the runtime's Python, from its own unpacked zip, secrets read from
SSM, next to the libraries that handler truly loads; and each zip's size.

The deployment is packaged with the project's own command (``npx osls package``, as
tests/deploy does; ``SLUICE_BENCH_PACKAGE=DIR`` reuses an osls ``--package`` output
instead, e.g. one made on another commit for a before/after). Each function's zip is
unpacked into a folder of its own and runs under CPython 3.12 started with ``-I -S``, its
``sys.path`` the unpacked zip and then what the python3.12 runtime provides (boto3 and
botocore: tests/deploy/lambda_check.py), as Lambda's bootstrap sets it. Each function gets
the environment the packaged template gives it: its secrets (the cron and signing
secrets, and a Postgres ``SLUICE_DATABASE_URL`` pointing at a scratch database on the
local Postgres) live only in SSM under ``SLUICE_SECRETS_PATH`` as SecureStrings, on a moto
server on 127.0.0.1 that ``AWS_ENDPOINT_URL_SSM`` points at, with fake credentials.
A fresh interpreter imports the handler module: the functions package first loads the
secrets through the real code path, then module-scope init runs (settings, services, the
job's drain); it reports the time and every module the import added. Another fresh
interpreter then imports just those modules (submodules included, in the same order), less
Sluice's own (``sluice``, ``functions``), and makes the minimal SSM fetch any function
would need: the same two signed GetParameters POSTs over ``http.client`` that the handler
makes (``sluice.core.awsjson``, whose imports are all stdlib), since with credentials in
the environment no SDK is needed. That is the floor no handler built on these libraries
could beat.

A separate row times the secret load alone in a fresh interpreter (Sluice's modules with
their stdlib imports, an HTTPS context as the real regional endpoint needs, the client,
the fetch) against its budget of 100 ms, and fails if botocore was imported.
Times are the child's CPU time (``time.process_time``), so other work on a shared
machine, and moto's own work in this process, do not swell them; medians over
``SLUICE_BENCH_REPEAT`` (default 7) runs each.

A function row's ratio is libraries / handler (>1 would mean faster than its own
libraries); the target is a ratio of at least 1/1.15 = 0.87, and the note gives each
function's time as a share of the HTTP function's and its zip's size, unpacked and zipped.
The secret row's ratio is budget / measured (at least 1 meets the budget).

Each function is measured twice: with OpenTelemetry off, as deployed by default (the rows
above: the zips never hold the ``otel`` extra, and no OTLP endpoint is set), and on (its
``otel on`` row): the extra's packages installed for the runtime into a folder of their
own, on the path after the task folder as a Lambda layer's ``/opt/python`` is, and
``OTEL_EXPORTER_OTLP_ENDPOINT`` set (nothing is sent during init: the set-up only builds
the providers). That row's baseline is the same function off; its ratio off / on.
With ``SLUICE_BENCH_BEFORE=DIR`` (an osls ``--package`` output of another commit, e.g. the
one before OpenTelemetry), each function of that package is measured in turn with this
one's, and a ``before`` row gives this one off against it (ratio before / now): what off
costs, on the same machine at the same time.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import Row, median, row, scratch_database
from tests.deploy.lambda_check import Function, functions, runtime_python, runtime_site

OWN = ("sluice", "functions")
SECRET_BUDGET_MS = 100.0
SECRETS_PATH = "/sluice/bench/"
REGION = "eu-north-1"
# the otel extra (pyproject.toml), as a layer would bring it
OTEL_PACKAGES = ("opentelemetry-api", "opentelemetry-sdk",
                 "opentelemetry-exporter-otlp-proto-http")
# on: an endpoint (a collector beside the function, as the ADOT layer's); nothing is sent
# during init
OTEL_ON = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}

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
names, parameters = json.loads(sys.argv[1]), json.loads(sys.argv[2])
start = time.process_time()
for name in names:
    try:
        importlib.import_module(name)
    except Exception:  # a module that only exists as a side effect of another import
        pass
import os
from sluice.core.awsjson import from_environ
ssm = from_environ("ssm", os.environ)
for i in range(0, len(parameters), 10):
    ssm.get_parameters(Names=parameters[i:i + 10], WithDecryption=True)
print(json.dumps({"seconds": time.process_time() - start}))
"""

# The real code path in phases: load_secrets would build its client itself; doing that
# first only splits the same work into parts. The moto endpoint is plain HTTP, but on
# Lambda it is HTTPS, whose client loads the system's CA certificates into an SSL context
# on first use: that is timed too ("tls") and counted in the total.
SECRET_LOAD = """
import json, sys, time
t0 = time.process_time()
from sluice.core import secrets
t1 = time.process_time()
import os  # the HTTPS context the client builds for the real regional endpoint (here
from sluice.core import awsjson  # it talks plain HTTP to the local SSM)
regional = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL")}
awsjson.from_environ("ssm", regional).tls_context()
t2 = time.process_time()
secrets._client("ssm")
t3 = time.process_time()
loaded = secrets.load_secrets()
t4 = time.process_time()
sdk = sorted(m for m in sys.modules if m.split(".")[0] in ("botocore", "boto3", "urllib3"))
print(json.dumps({"module": t1 - t0, "tls": t2 - t1, "client": t3 - t2, "fetch": t4 - t3,
                  "seconds": t4 - t0, "loaded": loaded, "sdk": sdk}))
"""


class Runtime(NamedTuple):
    """The runtime's Python and the folder of what the runtime provides beside a function."""

    python: str
    site: Path


def _reused(out: Path) -> list[Function]:
    """The functions of an osls ``--package`` output made earlier."""
    from tests.deploy.conftest import Packaged

    template = json.loads((out / "cloudformation-template-update-stack.json").read_text())
    return functions(Packaged(out, out, template, {}, ""))


def packaged_functions(scratch: Path) -> list[Function]:
    """The deployment's functions as osls packages them (or as ``SLUICE_BENCH_PACKAGE``
    holds them)."""
    from tests.deploy.conftest import copy_project, package

    reuse = os.environ.get("SLUICE_BENCH_PACKAGE")
    if reuse:
        return _reused(Path(reuse))
    service = scratch / "service"
    copy_project(service)
    return functions(package(service, scratch / "package"))


def unpack(fn: Function, scratch: Path) -> tuple[Path, int]:
    """``fn``'s zip unpacked into a folder of its own; that folder and the unpacked size."""
    task = scratch / fn.name
    with zipfile.ZipFile(fn.artifact) as archive:
        archive.extractall(task)
        return task, sum(info.file_size for info in archive.infolist())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def ssm_with_secrets(database_url: str) -> Iterator[str]:
    """A moto server on loopback holding the stage's secrets as SecureStrings; its URL."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        ssm = boto3.client("ssm", endpoint_url=endpoint, region_name=REGION,
                           aws_access_key_id="bench", aws_secret_access_key="bench")
        for name, value in {
            "CRON_SECRET": "bench-cron-secret-0123456789",
            "SLUICE_QUEUE_SIGNING_SECRET": "bench-signing-secret-0123456789",
            "SLUICE_DATABASE_URL": database_url,
        }.items():
            ssm.put_parameter(Name=SECRETS_PATH + name, Value=value, Type="SecureString",
                              Overwrite=True)
        yield endpoint
    finally:
        server.stop()


def _env(environment: dict[str, str], ssm_endpoint: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""), "LANG": "en_US.UTF-8", "TZ": ":UTC",
        **environment,
        "SLUICE_STAGE": "bench",
        "SLUICE_SECRETS_PATH": SECRETS_PATH,
        "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_SESSION_TOKEN": "bench",
        "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # any other AWS call: refused, on loopback
        "AWS_ENDPOINT_URL_SSM": ssm_endpoint,
        "PYTHONDONTWRITEBYTECODE": "1",  # a read-only /var/task: the zip's own .pyc only
    }


def otel_layer(target: Path) -> Path:
    """The ``otel`` extra's packages, at this environment's versions, installed for the
    runtime into ``target``: what a layer would put beside a function."""
    from importlib.metadata import version

    from tests.deploy.lambda_check import PLATFORM

    wanted = [f"{name}=={version(name)}" for name in OTEL_PACKAGES]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target",
                           str(target), *PLATFORM, *wanted],
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"installing the otel extra for the runtime failed:\n{done.stderr}")
    return target


def _child(code: str, args: list[str], env: dict[str, str], runtime: Runtime,
           task: Path, layer: Path | None = None) -> dict[str, Any]:
    """``code`` in a fresh runtime interpreter whose path is ``task``, ``layer`` (when
    given), then the runtime's."""
    path = [str(task), *([str(layer)] if layer else []), str(runtime.site)]
    preamble = f"import sys; sys.path[:0] = {path!r}\n"
    done = subprocess.run([runtime.python, "-I", "-S", "-c", preamble + code, *args], env=env,
                          cwd=task, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{args[0] if args else 'child'}: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(fn: Function, task: Path, repeat: int, ssm_endpoint: str, runtime: Runtime
            ) -> tuple[float, float, list[str]]:
    from sluice.core.secrets import SECRET_NAMES

    module, _, attr = fn.handler.rpartition(".")
    module = module.replace("/", ".")
    env = _env(fn.environment, ssm_endpoint)
    parameters = json.dumps([SECRETS_PATH + name for name in SECRET_NAMES])
    _child(HANDLER, [module, attr], env, runtime, task)  # the page cache, as a warm host has it
    handler_runs, library_runs = [], []
    libraries: list[str] = []
    for _ in range(repeat):
        probe = _child(HANDLER, [module, attr], env, runtime, task)
        # (FastAPI imports OpenTelemetry's API by itself: the HTTP function loads that)
        if any(m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))
               for m in probe["added"]):
            raise RuntimeError(f"{fn.name}: OpenTelemetry set up while off")
        handler_runs.append(probe["seconds"])
        libraries = [m for m in probe["added"]
                     if m.split(".")[0] not in OWN and not m.startswith("__")]
        library_runs.append(
            _child(LIBRARIES, [json.dumps(libraries), parameters], env, runtime, task)["seconds"])
    return median(handler_runs), median(library_runs), libraries


def measure_on(fn: Function, task: Path, repeat: int, ssm_endpoint: str, runtime: Runtime,
               layer: Path) -> tuple[float, int]:
    """``fn``'s handler time with OpenTelemetry on, and how many of its modules it added."""
    module, _, attr = fn.handler.rpartition(".")
    module = module.replace("/", ".")
    env = {**_env(fn.environment, ssm_endpoint), **OTEL_ON}
    _child(HANDLER, [module, attr], env, runtime, task, layer)
    runs, added = [], 0
    for _ in range(repeat):
        probe = _child(HANDLER, [module, attr], env, runtime, task, layer)
        otel = [m for m in probe["added"] if m.startswith("opentelemetry.sdk")]
        if not otel:
            raise RuntimeError(f"{fn.name}: OpenTelemetry on, yet its SDK was not set up")
        runs.append(probe["seconds"])
        added = sum(1 for m in probe["added"] if m.startswith("opentelemetry"))
    return median(runs), added


def measure_pair(now: Function, now_task: Path, before: Function, before_task: Path,
                 repeat: int, ssm_endpoint: str, runtime: Runtime) -> tuple[float, float]:
    """The handler times of the same function from this package and from ``before``'s,
    alternating run by run (so a busy moment of the machine weighs on both)."""
    runs: dict[str, list[float]] = {"now": [], "before": []}
    cases = {"now": (now, now_task), "before": (before, before_task)}
    for which, (fn, task) in cases.items():  # the page cache, as a warm host has it
        module, _, attr = fn.handler.rpartition(".")
        _child(HANDLER, [module.replace("/", "."), attr], _env(fn.environment, ssm_endpoint),
               runtime, task)
    for _ in range(repeat):
        for which, (fn, task) in cases.items():
            module, _, attr = fn.handler.rpartition(".")
            runs[which].append(_child(HANDLER, [module.replace("/", "."), attr],
                                      _env(fn.environment, ssm_endpoint), runtime,
                                      task)["seconds"])
    return median(runs["now"]), median(runs["before"])


def secret_load(repeat: int, ssm_endpoint: str, runtime: Runtime, task: Path) -> Row:
    env = _env({}, ssm_endpoint)
    _child(SECRET_LOAD, [], env, runtime, task)
    runs = [_child(SECRET_LOAD, [], env, runtime, task) for _ in range(repeat)]
    if any(len(run["loaded"]) != 3 for run in runs):
        raise RuntimeError(f"secret load: expected 3 secrets, got {runs[0]['loaded']}")
    if any(run["sdk"] for run in runs):
        raise RuntimeError(f"secret load imported an SDK: {runs[0]['sdk']}")
    ms = {key: median([run[key] for run in runs]) * 1000
          for key in ("seconds", "module", "tls", "client", "fetch")}
    note = (f"budget {SECRET_BUDGET_MS:.0f} ms; no SDK: Sluice modules + stdlib imports "
            f"{ms['module']:.0f}, HTTPS context {ms['tls']:.0f}, client {ms['client']:.1f}, "
            f"2 GetParameters {ms['fetch']:.0f}")
    return row("coldstart secret load: imports + set-up + fetch", ms["seconds"],
               SECRET_BUDGET_MS, "ms", higher_is_better=False, note=note)


def run() -> list[Row]:
    repeat = int(os.environ.get("SLUICE_BENCH_REPEAT", "7"))
    measured: dict[str, tuple[float, float, list[str]]] = {}
    measured_on: dict[str, tuple[float, int]] = {}
    paired: dict[str, tuple[float, float]] = {}
    sizes: dict[str, tuple[int, int]] = {}
    before_dir = os.environ.get("SLUICE_BENCH_BEFORE")
    with tempfile.TemporaryDirectory(prefix="sluice-coldstart-") as tmp:
        scratch = Path(tmp)
        found = packaged_functions(scratch)
        runtime = Runtime(runtime_python(), runtime_site(scratch / "var-runtime"))
        layer = otel_layer(scratch / "otel-layer")
        tasks = {}
        for fn in found:
            tasks[fn.name], unpacked = unpack(fn, scratch / "task")
            sizes[fn.name] = unpacked, fn.artifact.stat().st_size
        before = {fn.name: fn for fn in _reused(Path(before_dir))} if before_dir else {}
        before_tasks = {name: unpack(fn, scratch / "before")[0] for name, fn in before.items()}
        with scratch_database() as db, ssm_with_secrets(db.conninfo) as ssm_endpoint:
            for fn in found:  # off and on in turn, so both see the same machine
                measured[fn.name] = measure(fn, tasks[fn.name], repeat, ssm_endpoint, runtime)
                measured_on[fn.name] = measure_on(fn, tasks[fn.name], repeat, ssm_endpoint,
                                                  runtime, layer)
                if fn.name in before:
                    paired[fn.name] = measure_pair(fn, tasks[fn.name], before[fn.name],
                                                   before_tasks[fn.name], repeat,
                                                   ssm_endpoint, runtime)
            secrets_row = secret_load(repeat, ssm_endpoint, runtime, tasks[found[0].name])
    http = next((measured[fn.name][0] for fn in found if fn.kind == "http"), None)
    rows = []
    for fn in found:
        handler_s, libraries_s, libraries = measured[fn.name]
        third_party = {m.split(".")[0] for m in libraries} - set(sys.stdlib_module_names)
        share = f"{handler_s / http:.0%} of http; " if http else ""
        unpacked, zipped = sizes[fn.name]
        rows.append(row(f"coldstart {fn.name}", handler_s * 1000, libraries_s * 1000, "ms",
                        higher_is_better=False,
                        note=f"{share}{unpacked / 1e6:.1f} MB unpacked, {zipped / 1e6:.1f} MB "
                             f"zipped; libs: {', '.join(sorted(third_party)) or 'stdlib only'}"))
    for fn in found:
        off_s = measured[fn.name][0]
        on_s, modules = measured_on[fn.name]
        rows.append(row(f"coldstart {fn.name} otel on", on_s * 1000, off_s * 1000, "ms",
                        higher_is_better=False,
                        note=f"{(on_s - off_s) * 1000:+.0f} ms over off; {modules} "
                             "opentelemetry modules (SDK, OTLP/HTTP exporter) from a layer"))
    for fn in found:
        if fn.name in paired:
            now_s, before_s = paired[fn.name]
            rows.append(row(f"coldstart {fn.name} off vs before", now_s * 1000, before_s * 1000,
                            "ms", higher_is_better=False,
                            note=f"{(now_s - before_s) * 1000:+.0f} ms; before: the package in "
                                 "SLUICE_BENCH_BEFORE, runs alternating"))
    rows.append(secrets_row)
    return rows
