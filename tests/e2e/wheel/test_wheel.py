"""The built wheel on its own, in a fresh venv, next to an app that extends it.

The wheel is built from a copy of the checkout (``pip wheel --no-deps``) and installed in a
venv of the test's own; the third-party dependencies come from this environment's
site-packages through a ``.pth`` line (a path line only: the editable install's finder in
there is never run, so nothing of the checkout is importable). The example app
(docs/examples/exampleapp: its own ``shared`` package, job, topic and channel) is built
and installed beside it (``pip install --target``, on ``PYTHONPATH``) as a distribution,
found by its ``sluice.extensions`` entry point; the venv's site-packages stays Sluice's.
The app's topic gets one message from ``sluice.publish`` and one signed and POSTed by the
JavaScript example (docs/examples/app.js) to ``sluice dev``'s push route. Oracles: what the
venv's site-packages holds, what the app's pager stand-in received, and the files
``sluice generate`` wrote.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
import yaml

from tests.conftest import CRON_SECRET, ROOT, free_port
from tests.providers.http import ProviderServer, json_response

APP = ROOT / "docs" / "examples" / "exampleapp"
SECRET = "wheel-queue-secret-0123456789"
pytestmark = pytest.mark.slow


class Venv(NamedTuple):
    root: Path
    site: Path
    wheel: Path

    def bin(self, name: str) -> str:
        return str(self.root / "bin" / name)


def _copy(source: Path, target: Path) -> None:
    # symlinks=False: the package data that links to infra/plugins/ is copied as files
    shutil.copytree(source, target, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build"))


def _build(project: Path, out: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index",
                           "--no-build-isolation", "-q", "-w", str(out), str(project)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    [wheel] = out.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    base = tmp_path_factory.mktemp("wheel")
    source = base / "sluice"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    _copy(ROOT / "shared", source / "shared")
    wheel = _build(source, base / "dist")
    root = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    [site] = (root / "lib").glob("python*/site-packages")
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, timeout=300)
    return Venv(root, site, wheel)


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "CRON_SECRET": CRON_SECRET,
            "SLUICE_DATABASE_URL": f"sqlite:///{tmp / 'app.db'}",
            "SLUICE_QUEUE_SIGNING_SECRET": SECRET, **extra}


def _run(venv: Venv, args: list[str], env: dict[str, str], cwd: Path) -> Any:
    done = subprocess.run([venv.bin(args[0]), *args[1:]], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return json.loads(done.stdout) if "--json" in args else done.stdout


def test_the_wheel_holds_one_package_and_works_alone(venv: Venv, tmp_path: Path) -> None:
    tops = {p.name for p in venv.site.iterdir()}
    assert "sluice" in tops and not tops & {"shared", "functions", "infra", "tests"}, tops
    import zipfile

    names = zipfile.ZipFile(venv.wheel).namelist()
    # the distribution is sluice-lambda (`sluice` on PyPI is another project); the import
    # name is sluice
    assert {n.split("/")[0] for n in names} == {"sluice", "sluice_lambda-0.1.0.dist-info"}
    assert "sluice/store/migrations/0001_foundation.sqlite.sql" in names
    assert "sluice/deploy/plugins/sluice-packaging.js" in names
    env = _env(tmp_path)
    probe = ("import sluice, sys; print(sluice.__file__); import importlib.util as u; "
             "print(u.find_spec('shared'), u.find_spec('functions'))")
    where, missing = _run(venv, ["python", "-c", probe], env, tmp_path).splitlines()
    assert where.startswith(str(venv.site)), where
    assert missing == "None None"
    migrated = _run(venv, ["sluice", "migrate", "--json"], env, tmp_path)
    shipped = sorted(ROOT.glob("shared/sluice/store/migrations/*.sqlite.sql"))
    assert migrated["dialect"] == "sqlite"
    assert [m["version"] for m in migrated["applied"]] == [p.name[:4] for p in shipped]
    cleanup = _run(venv, ["sluice", "run", "state-cleanup", "--json"], env, tmp_path)
    assert "deletedHashRecords" in cleanup
    api = ("import sluice; s = sluice.connect(); "
           "e = sluice.enqueue_delivery(s, 'webhook', 'https://example.com/h', {'text': 'hi'}); "
           "print(e.status.value)")
    assert _run(venv, ["python", "-c", api], env, tmp_path).strip() == "pending"


class Pager:
    """The app's pager service: takes ``POST /pages/<id>`` with ``{"text": ...}``."""

    def __init__(self) -> None:
        self.pages: list[dict[str, Any]] = []
        self.http = ProviderServer(self._handle)

    def _handle(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        if method != "POST" or not path.startswith("/pages/"):
            return json_response(404, {"error": "not found"})
        self.pages.append({"pager": path.removeprefix("/pages/"), **json.loads(body),
                           "key": headers.get("idempotency-key")})
        return json_response(200, {"id": f"page-{len(self.pages)}"})


@pytest.fixture
def pager() -> Iterator[Pager]:
    stand_in = Pager()
    with stand_in.http:
        yield stand_in


@pytest.fixture(scope="module")
def app_site(venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the app is installed, next to the venv (its PYTHONPATH)."""
    base = tmp_path_factory.mktemp("app")
    _copy(APP, base / "exampleapp")
    wheel = _build(base / "exampleapp", base / "dist")
    subprocess.run([venv.bin("python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(base / "site"), str(wheel)], check=True, timeout=300)
    return base / "site"


def _node(script: str, payload: Any) -> Any:
    """Run ``script`` with ``app`` = docs/examples/app.js and ``input`` = ``payload``."""
    program = (f"const app = require({json.dumps(str(ROOT / 'docs' / 'examples' / 'app.js'))});"
               "const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
               f"(async () => {{ {script} }})().catch(e => {{ console.error(e); "
               "process.exit(1); });")
    done = subprocess.run(["node", "-e", program], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _serve(venv: Venv, env: dict[str, str], cwd: Path, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([venv.bin("sluice"), "dev", "--port", str(port)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"sluice dev did not start: {proc.communicate()[0]}")


def test_an_app_extends_the_installed_wheel(venv: Venv, app_site: Path, pager: Pager,
                                            tmp_path: Path) -> None:
    env = _env(tmp_path, EXAMPLEAPP_PAGER_URL=pager.http.url, PYTHONPATH=str(app_site))
    # the app's `shared` is its own; Sluice's wheel brings none
    probe = "import shared; print(shared.__file__)"
    assert _run(venv, ["python", "-c", probe], env, tmp_path).startswith(str(app_site / "shared"))
    _run(venv, ["sluice", "migrate"], env, tmp_path)
    port = free_port()
    proc = _serve(venv, env, tmp_path, port)
    try:
        base = f"http://127.0.0.1:{port}"
        health = httpx.get(f"{base}/api/health").json()
        assert "exampleapp-digest" in health["jobs"]
        # the app's topic, run in process (local mode) by the app's code calling the API
        publish = ("import sluice; s = sluice.connect(); "
                   "p = sluice.publish(s, 'exampleapp.signup', "
                   "{'userId': 'u1', 'name': 'Ada', 'pager': 'team-a'}); print(p.outcome)")
        assert _run(venv, ["python", "-c", publish], env, tmp_path).strip() == "done"
        # and a signed message POSTed by the JavaScript example to sluice dev's push route
        pushed = _node("const m = app.buildMessage('exampleapp.signup', "
                       "{userId: 'u2', name: 'Grace', pager: 'team-b'}, input.secret);"
                       "console.log(JSON.stringify(await app.pushMessage(input.base, m)));",
                       {"base": base, "secret": SECRET})
        assert (pushed["status"], pushed["body"]["outcome"]) == (200, "done"), pushed
        # the app's job through its own cron route on the dev server
        bearer = {"authorization": f"Bearer {CRON_SECRET}"}
        digest = httpx.get(f"{base}/api/admin/exampleapp/digest", headers=bearer, timeout=30)
        assert digest.status_code == 200, digest.text
        # the delivery queue sends both through the app's channel
        drained = httpx.get(f"{base}/api/admin/delivery/drain", headers=bearer, timeout=60)
        assert drained.status_code == 200, drained.text
    finally:
        proc.terminate()
        output = proc.communicate(timeout=20)[0]
    assert re.search(r"^  exampleapp-digest +next at ", output, re.MULTILINE), output
    assert "jobs exampleapp-digest; topics exampleapp.signup; channels exampleapp-pager" in output
    by_pager = {page["pager"]: page for page in pager.pages}
    assert {"team-a", "team-b"} <= set(by_pager), drained.text
    assert by_pager["team-a"]["text"] == "Welcome aboard, Ada!"
    assert by_pager["team-a"]["key"] == "signup:u1"
    assert by_pager["team-b"]["text"] == "Welcome aboard, Grace!"
    assert by_pager["team"]["text"].startswith("digest for ")
    assert len(pager.pages) == 3


def test_sluice_generate_writes_the_apps_deployment(venv: Venv, app_site: Path,
                                                   tmp_path: Path) -> None:
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    env = _env(tmp_path, PYTHONPATH=str(app_site))
    written = _run(venv, ["sluice", "generate", "--service", "exampleapp", "--json"], env,
                   deploy)
    assert set(written["written"]) == {
        "serverless.yml", "infra/queues.yml", "infra/alarms.yml", "infra/iam.yml",
        "infra/plugins/sluice-packaging.js", "infra/plugins/inject_deps.py"}

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: f"!{suffix}")
    serverless = yaml.load((deploy / "serverless.yml").read_text(), Loader=Loader)
    functions = serverless["functions"]
    digest, signup = functions["exampleappDigest"], functions["exampleappSignup"]
    assert digest["handler"] == "sluice/lambda_handlers/cron.handler"
    assert digest["environment"] == {"SLUICE_JOB": "exampleapp-digest"}
    assert digest["events"] == [{"schedule": {"rate": "rate(1 minute)"}}]
    assert signup["handler"] == "sluice/lambda_handlers/consumers.handler"
    assert signup["events"][0]["sqs"]["batchSize"] == 5
    assert functions["http"]["handler"] == "sluice/lambda_handlers/http.handler"
    # the app runs the delivery pack alone (its PACKS): Sluice's core job and the drain
    assert set(functions) == {"http", "stateCleanup", "deliveryDrain", "exampleappDigest",
                              "exampleappSignup"}
    assert {'exampleapp/**', 'shared/**'} <= set(serverless["package"]["patterns"])
    assert serverless["service"] == "exampleapp"
    queues = yaml.load((deploy / "infra" / "queues.yml").read_text(), Loader=Loader)
    assert {"ExampleappSignupQueue", "ExampleappSignupDlq"} <= set(queues["Resources"])
    iam = yaml.load((deploy / "infra" / "iam.yml").read_text(), Loader=Loader)
    assert "ExampleappSignupConsumerRole" in iam["Resources"]
    alarms = yaml.load((deploy / "infra" / "alarms.yml").read_text(), Loader=Loader)
    assert {"ExampleappSignupDlqDepthAlarm", "ExampleappDigestErrorsAlarm"} <= set(
        alarms["Resources"])
    # a second run finds nothing to write, and --check agrees
    again = _run(venv, ["sluice", "generate", "--check", "--json"], env, deploy)
    assert again["stale"] == []
    (deploy / "infra" / "queues.yml").write_text("edited\n")
    done = subprocess.run([venv.bin("sluice"), "generate", "--check"], env=env, cwd=deploy,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "stale infra/queues.yml" in done.stdout
    assert "SLUICE_APP" not in env, "found by its entry point"
