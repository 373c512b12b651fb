"""Run a packaged function as Lambda runs it.

Its zip is unpacked into a clean folder; the runtime's Python (CPython 3.12, started with
``-I -S``: the standard library and nothing else) gets beside it only what the python3.12
runtime provides (boto3, botocore and their dependencies, and AWS's runtime interface
client ``awslambdaric``, at the versions this environment has), and starts the way the
runtime's bootstrap does: ``awslambdaric`` with the handler, ``AWS_LAMBDA_RUNTIME_API``
pointing at a local Runtime API (tests/providers/lambda_runtime.py), Lambda's own
variables and the function's environment from the packaged template. One event is queued;
what the runtime client posts back (a response, an invocation error, or an init error) is
the outcome.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path
from typing import Any, NamedTuple

from tests.deploy.conftest import Packaged
from tests.providers.lambda_runtime import Outcome, RuntimeApi

RUNTIME = "python3.12"
PLATFORM = ("--platform", "manylinux2014_x86_64", "--python-version", "3.12",
            "--implementation", "cp", "--only-binary=:all:")
# what /var/runtime/bootstrap does: the task folder first, the runtime's own beside it
BOOTSTRAP = """
import sys
task, runtime, handler = sys.argv[1:4]
sys.path[:0] = [task, runtime]
from awslambdaric.__main__ import main
main([sys.argv[0], handler])
"""
ANSWER_S = 120


def runtime_python() -> str:
    """An interpreter of the runtime's version, found as the packaging plugin finds it."""
    candidates = [os.environ.get("SLUICE_BYTECODE_PYTHON", ""), shutil.which(RUNTIME) or ""]
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = Path(subprocess.run([pyenv, "root"], capture_output=True, text=True,
                                   check=True).stdout.strip())
        versions = sorted((root / "versions").glob("3.12*"), reverse=True)
        candidates += [str(v / "bin" / RUNTIME) for v in versions]
    for python in filter(None, candidates):
        done = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"],
                              capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.strip() == "(3, 12)":
            return python
    raise RuntimeError("no CPython 3.12 here (python3.12 on PATH, pyenv's 3.12.x, or "
                       "SLUICE_BYTECODE_PYTHON): install one, e.g. `pyenv install 3.12`")


def runtime_site(target: Path) -> Path:
    """What the python3.12 runtime has beside a function, installed for it into ``target``:
    awslambdaric and boto3 at this environment's versions, with their dependencies."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--target", str(target), *PLATFORM,
         f"awslambdaric=={version('awslambdaric')}", f"boto3=={version('boto3')}"],
        capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"installing the runtime's own packages failed:\n{done.stderr}")
    return target


class Function(NamedTuple):
    name: str  # as deployed: <service>-<stage>-<key>
    handler: str
    environment: dict[str, str]
    artifact: Path

    @property
    def kind(self) -> str:
        """The handler's module file: ``http``, ``cron`` or ``consumers``."""
        return self.handler.rpartition(".")[0].rpartition("/")[2]


def functions(packaged: Packaged) -> list[Function]:
    found = []
    for fn in packaged.functions().values():
        props = fn["Properties"]
        variables = props.get("Environment", {}).get("Variables", {})
        found.append(Function(
            props["FunctionName"], props["Handler"],
            {k: v for k, v in variables.items() if isinstance(v, str)},
            packaged.out / props["Code"]["S3Key"].rsplit("/", 1)[1]))
    return sorted(found)


class Started(NamedTuple):
    function: Function
    outcome: Outcome | None  # None: the runtime exited or went quiet without posting one
    log: str  # the runtime process's output

    def failure(self) -> str | None:
        """Why this start failed, naming the function; None when it answered."""
        name, outcome = self.function.name, self.outcome
        if outcome is None:
            return f"{name}: no answer from the runtime client:\n{self.log[-3000:]}"
        if outcome.kind == "init_error":
            return (f"{name}: init failed: {outcome.body.get('errorType')}: "
                    f"{outcome.body.get('errorMessage')}")
        if outcome.kind == "error":
            return (f"{name}: the invocation failed: {outcome.body.get('errorType')}: "
                    f"{outcome.body.get('errorMessage')}")
        return None


def invoke(fn: Function, event: Any, *, python: str, site: Path, env: dict[str, str],
           scratch: Path) -> Started:
    """Start ``fn`` from its unpacked zip under awslambdaric and invoke it with ``event``."""
    task = scratch / "task"
    with zipfile.ZipFile(fn.artifact) as archive:
        archive.extractall(task)
    with RuntimeApi(fn.name, fn.handler) as api:
        lambda_env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "en_US.UTF-8", "TZ": ":UTC",
            "LAMBDA_TASK_ROOT": str(task), "LAMBDA_RUNTIME_DIR": str(site),
            "_HANDLER": fn.handler, "AWS_LAMBDA_RUNTIME_API": api.address,
            "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
            "AWS_LAMBDA_FUNCTION_NAME": fn.name, "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
            "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{fn.name}",
            "AWS_LAMBDA_LOG_STREAM_NAME": "2026/12/06/[$LATEST]0123456789abcdef",
            # /var/task is read-only on Lambda: nothing is written beside the shipped .pyc
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        with (scratch / "runtime.log").open("w+") as log:
            proc = subprocess.Popen(
                [python, "-I", "-S", "-c", BOOTSTRAP, str(task), str(site), fn.handler],
                env={**lambda_env, **env, **fn.environment}, cwd=task, stdout=log,
                stderr=subprocess.STDOUT)
            try:
                request = api.invoke(event)
                outcome = api.outcome(request, ANSWER_S, alive=lambda: proc.poll() is None)
                if outcome is None:  # an answer posted just before the process exited
                    outcome = api.outcome(request, 0.5)
            finally:
                if proc.poll() is None:  # the Shutdown phase: SIGTERM when an extension
                    api.shutdown(proc.pid)  # registered, then SIGKILL after Lambda's 500 ms
                    try:
                        proc.wait(timeout=0.5 if api.sigterm_sent else 0)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(timeout=10)
            log.seek(0)
            return Started(fn, outcome, log.read())

