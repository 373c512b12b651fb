"""Package the service once per run with the real toolchain: ``npx osls package --stage test``.

The project is copied to a temporary folder (so concurrent runs and the working tree
never share ``.serverless/``), ``node_modules`` is installed with ``npm ci`` when
missing, and osls runs with dummy AWS credentials and every AWS endpoint pointed at a
closed local port: packaging must not need any AWS service. Python wheels come from
PyPI through serverless-python-requirements (cached per requirements checksum).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

STAGE = "test"
PREFIX = f"sluice-{STAGE}-"
PROJECT_FILES = ("serverless.yml", "package.json", "package-lock.json", "pyproject.toml")
PROJECT_DIRS = ("functions", "shared", "infra")


def ensure_node_modules() -> Path:
    """``npm ci`` from the lock file when ``node_modules`` lacks osls; loud if npm is absent.
    Both test workers may get here on a fresh checkout: a file lock lets one install while
    the other waits (two ``npm ci`` at once each delete the other's ``node_modules``)."""
    osls = ROOT / "node_modules" / ".bin" / "osls"
    if osls.exists():
        return osls
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed: the deployment tests need Node.js 20+ and npm "
                           "(apt-get install nodejs npm), then `npm ci` in the checkout")
    with (ROOT / ".npm-ci.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if osls.exists():  # the other worker installed it while this one waited
            return osls
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=ROOT,
                              capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0 or not osls.exists():
        raise RuntimeError(f"npm ci failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return osls


@dataclass
class Packaged:
    service_dir: Path
    out: Path
    template: dict[str, Any]
    create_template: dict[str, Any]
    log: str

    @property
    def resources(self) -> dict[str, Any]:
        resources: dict[str, Any] = self.template["Resources"]
        return resources

    def of_type(self, kind: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.resources.items() if v["Type"] == kind}

    def functions(self) -> dict[str, dict[str, Any]]:
        return self.of_type("AWS::Lambda::Function")

    def zip_names(self, logical_id: str) -> set[str]:
        key = self.resources[logical_id]["Properties"]["Code"]["S3Key"]
        with zipfile.ZipFile(self.out / key.rsplit("/", 1)[1]) as archive:
            return set(archive.namelist())


@pytest.fixture(scope="session")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Packaged]:
    ensure_node_modules()
    base = tmp_path_factory.mktemp("osls")
    service = base / "service"
    service.mkdir()
    for name in PROJECT_FILES:
        shutil.copy2(ROOT / name, service / name)
    for name in PROJECT_DIRS:
        shutil.copytree(ROOT / name, service / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".serverless"))
    (service / "node_modules").symlink_to(ROOT / "node_modules")
    out = base / "package"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "eu-north-1",
        # any AWS call would fail here: packaging must be offline
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "SLS_TELEMETRY_DISABLED": "1", "SLS_NOTIFICATIONS_MODE": "off",
    })
    command = ["npx", "--no", "osls", "package", "--stage", STAGE, "--package", str(out),
               "--verbose"]
    done = subprocess.run(command, cwd=service, env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise AssertionError(f"osls package failed ({done.returncode}):\n{log}")
    yield Packaged(
        service_dir=service,
        out=out,
        template=json.loads((out / "cloudformation-template-update-stack.json").read_text()),
        create_template=json.loads((out / "cloudformation-template-create-stack.json").read_text()),
        log=log,
    )
