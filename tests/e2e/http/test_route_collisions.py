"""An app's job that declares a route Sluice already serves would take it over unseen (its
routes are added first): the HTTP app refuses to start, naming the job and the route.

Through ``create_app`` (what the HTTP Lambda builds at cold start) and ``sluice dev``."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import sluice.http.app as http_app
import sluice.http.served as http_served
from sluice.core.errors import ConfigurationError
from sluice.core.extensions import load
from sluice.core.services import Services
from sluice.http.app import create_app
from sluice.jobs.registry import JOBS, Job
from tests.conftest import BASE_ENV, free_port


def _job(route: str) -> Job:
    return Job(name="acme-take", route=route, schedule="rate(5 minutes)", surface="delivery",
               target="acme.work:run", budget_s=20.0, timeout_s=30)


@pytest.fixture
def services(sqlite_url: str, make_services: Callable[..., Services]) -> Services:
    return make_services(sqlite_url)


@pytest.fixture
def module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    made = types.ModuleType("acme_ext")
    monkeypatch.setitem(sys.modules, "acme_ext", made)
    yield made


@pytest.mark.parametrize(("route", "taken"), [
    ("/api/admin/delivery/replay", ("POST /api/admin/delivery/replay, which Sluice serves as "
                                   "'delivery:replay' (/api/admin/delivery/replay)")),
    ("/api/queue/status", ("GET /api/queue/status, which Sluice serves as "
                          "'delivery:queue_status' (/api/queue/status)")),
    ("/api/admin/jobs", "GET /api/admin/jobs, which Sluice serves as 'jobs'"),
    ("/api/admin/dlq/quarantine", ("GET /api/admin/dlq/quarantine, which Sluice serves as "
                                  "'dlq:list' (/api/admin/dlq/{name})")),
])
def test_a_job_on_a_route_sluice_serves_is_refused_at_start_up(
        module: types.ModuleType, monkeypatch: pytest.MonkeyPatch, services: Services,
        route: str, taken: str) -> None:
    module.JOBS = [_job(route)]
    monkeypatch.setattr(http_app, "JOBS", JOBS.using(load(["acme_ext"], group=None)))
    with pytest.raises(ConfigurationError) as caught:
        create_app(services)
    assert caught.value.message.startswith(f"job 'acme-take' declares the route {taken}")


def test_a_route_of_a_pack_that_is_off_is_free(module: types.ModuleType,
                                               monkeypatch: pytest.MonkeyPatch,
                                               services: Services) -> None:
    module.JOBS, module.PACKS = [_job("/api/admin/erasure/summary")], ["delivery"]
    monkeypatch.setattr(http_app, "JOBS", JOBS.using(load(["acme_ext"], group=None)))
    monkeypatch.setattr(http_served, "packs_on", lambda: ("delivery",))
    app = create_app(services)
    assert "/api/admin/erasure/summary" in app.openapi()["paths"]
    # and with the erasure pack on it is taken
    module.PACKS = ["delivery", "erasure"]
    monkeypatch.setattr(http_app, "JOBS", JOBS.using(load(["acme_ext"], group=None)))
    monkeypatch.setattr(http_served, "packs_on", lambda: ("erasure", "delivery"))
    with pytest.raises(ConfigurationError, match="'erasure:summary'"):
        create_app(services)


def test_sluice_dev_refuses_to_start(tmp_path: Path) -> None:
    (tmp_path / "acme_ext.py").write_text(
        "from sluice.extend import Job\n"
        "JOBS = [Job(name='acme-replay', route='/api/admin/delivery/replay', "
        "schedule='rate(5 minutes)', surface='delivery', target='acme.work:run', "
        "budget_s=20.0, timeout_s=30)]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "CRON_"))}
    env.update({**BASE_ENV, "SLUICE_APP": "acme_ext", "PYTHONPATH": str(tmp_path),
                "SLUICE_DATABASE_URL": f"sqlite:///{tmp_path}/dev.db"})
    done = subprocess.run([sys.executable, "-m", "sluice.cli.main", "dev", "--no-scheduler",
                           "--port", str(free_port())], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 78, done.stderr
    assert ("sluice: configuration_error: job 'acme-replay' declares the route POST "
            "/api/admin/delivery/replay, which Sluice serves as 'delivery:replay'") in done.stderr
