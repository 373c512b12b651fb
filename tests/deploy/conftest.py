"""Package once per run with the real toolchain: ``npx osls package --stage test``.

Two deployments: Sluice's own (``packaged``) and the example app's (``packaged_app``:
docs/examples/exampleapp, deployed as docs/deployment.md says, its lock made by the
documented step from a clean folder and its wiring by ``sluice generate``). Each is copied
to a temporary folder (so concurrent runs and the working tree never share
``.serverless/``), ``node_modules`` is installed with ``npm ci`` when missing, and osls
runs with dummy AWS credentials and every AWS endpoint pointed at a closed local port:
packaging must not need any AWS service. Python wheels come from PyPI through
serverless-python-requirements (cached per requirements checksum).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
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
APP = ROOT / "docs" / "examples" / "exampleapp"
APP_SERVICE = "exampleapp"
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".serverless", "*.egg-info", "build")


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


def package(service: Path, out: Path) -> Packaged:
    """``npx osls package`` of the deployment folder ``service`` into ``out``."""
    if not (service / "node_modules").exists():
        (service / "node_modules").symlink_to(ensure_node_modules().parents[1])
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
    done = subprocess.run(command, cwd=service, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise AssertionError(f"osls package failed ({done.returncode}):\n{log}")
    return Packaged(
        service_dir=service,
        out=out,
        template=json.loads((out / "cloudformation-template-update-stack.json").read_text()),
        create_template=json.loads((out / "cloudformation-template-create-stack.json").read_text()),
        log=log,
    )


def copy_project(service: Path) -> Path:
    """Sluice's own deployment folder, copied to ``service``."""
    service.mkdir(parents=True)
    for name in PROJECT_FILES:
        shutil.copy2(ROOT / name, service / name)
    for name in PROJECT_DIRS:
        shutil.copytree(ROOT / name, service / name, ignore=IGNORED)
    return service


@pytest.fixture(scope="session")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> Packaged:
    base = tmp_path_factory.mktemp("osls")
    return package(copy_project(base / "service"), base / "package")


def lock_step() -> str:
    """The app's lock step of docs/deployment.md, as written there (a bash block)."""
    page = (ROOT / "docs" / "deployment.md").read_text()
    section = page[page.index("## Deploying an app with Sluice"):]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    [block] = [b for b in blocks if "uv pip compile" in b]
    return re.sub(r"^ {3}", "", block, flags=re.MULTILINE)


def app_environment(site: Path | None = None) -> dict[str, str]:
    """This environment's tools first on PATH (pip, uv, sluice), no Sluice settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "AWS_"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return env


@pytest.fixture(scope="session")
def app_deployment(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The example app's deployment folder, made as docs/deployment.md says: the app's
    repository with its lock (the documented step, run from a folder holding only the app)
    and its wiring (``sluice generate`` with the app installed as a distribution, found
    by its entry point); with the environment that ran ``sluice generate``."""
    base = tmp_path_factory.mktemp("app")
    source = base / "sluice"  # a checkout of Sluice, as the lock step names it
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "shared", source / "shared", symlinks=False, ignore=IGNORED)
    app = base / APP_SERVICE
    shutil.copytree(APP, app, ignore=IGNORED)
    step = lock_step().replace("/path/to/sluice", str(source))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", step], cwd=app,
                          env=app_environment(), capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, f"the documented lock step failed:\n{step}\n{done.stderr}"
    site = base / "site"  # the app installed as a distribution (its entry point), as pip does
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--no-index", "--no-build-isolation", "--target", str(site),
                           str(app)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    for leftover in ("build", f"{APP_SERVICE}.egg-info"):
        shutil.rmtree(app / leftover, ignore_errors=True)
    env = app_environment(site)
    done = subprocess.run([sys.executable, "-m", "sluice.cli.main", "generate", "--service",
                           APP_SERVICE], cwd=app, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    shutil.copy2(ROOT / "package.json", app / "package.json")
    shutil.copy2(ROOT / "package-lock.json", app / "package-lock.json")
    return app, env


@pytest.fixture(scope="session")
def packaged_app(app_deployment: tuple[Path, dict[str, str]],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Packaged]:
    app, _ = app_deployment
    packaged = package(app, tmp_path_factory.mktemp("app-package"))
    yield packaged
    # its requirements name this run's wheel folder, so their installed copy in
    # serverless-python-requirements' cache is never used again
    for cached in re.findall(r'Installing requirements from "([^"]+)/requirements.txt"',
                             packaged.log):
        if str(app) in Path(cached, "requirements.txt").read_text():
            shutil.rmtree(cached, ignore_errors=True)
