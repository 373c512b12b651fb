"""The packages run on the Lambda runtime's Python: unzipped, each handler imports under
CPython 3.12 from its own zip (manylinux wheels, shipped bytecode), with only boto3 taken
from outside, as the Lambda runtime provides it."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.deploy.conftest import Packaged

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RUNTIME = "python3.12"
PROBE = """
import importlib, sys, time
sys.path[:0] = [sys.argv[1]]
sys.path.append(sys.argv[2])  # boto3/botocore, which the Lambda runtime provides
module, attr = sys.argv[3], sys.argv[4]
handler = getattr(importlib.import_module(module), attr)
assert callable(handler)
own = sys.modules["sluice.core.settings"]
assert own.__spec__.cached.startswith(sys.argv[1]) and own.__spec__.cached.endswith(".cpython-312.pyc")
print(sorted(m for m in sys.modules if m.split(".")[0] in ("fastapi", "pydantic_core", "psycopg")))
"""


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


def test_packaging_compiled_bytecode_for_the_runtime(packaged: Packaged) -> None:
    runtime_python()
    assert "with cpython-312 bytecode" in packaged.log
    for logical_id, fn in packaged.functions().items():
        module = fn["Properties"]["Handler"].rpartition(".")[0]
        folder, _, name = module.rpartition("/")
        assert f"{folder}/__pycache__/{name}.cpython-312.pyc" in packaged.zip_names(logical_id)


@pytest.mark.parametrize("kind", ["http", "consumer", "scheduled"])
def test_handler_imports_from_its_zip_under_the_runtime_python(packaged: Packaged, kind: str,
                                                              tmp_path: Path) -> None:
    python = runtime_python()
    functions = packaged.functions()
    logical_id, fn = next(
        (k, v) for k, v in sorted(functions.items())
        if (kind == "http" and v["Properties"]["Handler"].startswith("functions/http."))
        or (kind == "consumer" and v["Properties"]["Handler"].startswith("functions/consumers."))
        or (kind == "scheduled" and "SLUICE_JOB" in v["Properties"]["Environment"]["Variables"]))
    key = fn["Properties"]["Code"]["S3Key"].rsplit("/", 1)[1]
    task = tmp_path / "task"
    with zipfile.ZipFile(packaged.out / key) as archive:
        archive.extractall(task)
    import botocore

    runtime_boto = str(Path(botocore.__file__).parent.parent)
    module, _, attr = fn["Properties"]["Handler"].rpartition(".")
    env = {
        "PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
        "PYTHONDONTWRITEBYTECODE": "1",  # like Lambda's read-only /var/task
        **fn["Properties"]["Environment"]["Variables"],
        "SLUICE_SECRETS_PATH": "",  # no SSM here; secrets set directly
        "SLUICE_DATABASE_URL": f"sqlite:///{tmp_path}/sluice.db",
        "CRON_SECRET": "cron-secret-for-tests-0123456789",
        "SLUICE_QUEUE_SIGNING_SECRET": "signing-secret-for-tests-0123456789",
        "SLUICE_ADMIN_JWT_SECRET": "admin-jwt-secret-for-tests-0123456789abcdef",
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "eu-north-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    }

    done = subprocess.run([python, "-I", "-c", PROBE, str(task), runtime_boto,
                           module.replace("/", "."), attr],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)

    assert done.returncode == 0, f"{logical_id}:\n{done.stderr}"
    loaded = done.stdout
    assert ("fastapi" in loaded and "pydantic_core" in loaded) == (kind == "http"), loaded
