"""Missed runs from the run log, on both backends: a job whose last scheduled run is older
than its schedule plus the grace is ``overdue`` in ``GET /api/admin/jobs`` and ``sluice
jobs``, with the expected and last run times; one marked disabled on purpose (an audited
admin action, from the API or the command line) is ``disabled`` instead."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from sluice.cli.main import main
from sluice.core.services import Services
from sluice.core.times import iso_z
from sluice.http.app import create_app
from sluice.jobs.runs import RunStore
from sluice.store.db import Database, utcnow
from tests.conftest import BASE_ENV, admin_token


def ops() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['super_admin'], subject='ops-1')}"}


def add_run(db: Database, job: str, trigger: str, at: datetime) -> None:
    with db.transaction() as tx:
        tx.execute("INSERT INTO job_runs (id, job, trigger, started_at, finished_at, "
                   "duration_ms, outcome) VALUES (:id, :job, :trigger, :at, :at, 5, 'ok')",
                   {"id": f"{job}-{trigger}-{at.timestamp()}", "job": job, "trigger": trigger,
                    "at": at})


def seed(db: Database, now: datetime) -> None:
    # metering-flush, every 5 minutes: last fired 20 min ago, due 15 min ago, grace 5 min
    add_run(db, "metering-flush", "schedule", now - timedelta(minutes=20))
    add_run(db, "metering-flush", "admin", now - timedelta(minutes=1))  # not the scheduler
    # delivery-drain, every minute: fired 30 s ago
    add_run(db, "delivery-drain", "schedule", now - timedelta(seconds=30))
    # ledger-redrive: an external scheduler's cron GET counts as a scheduled run
    add_run(db, "ledger-redrive", "cron_http", now - timedelta(minutes=2))
    # rss-refresh, every 10 minutes: 3 hours quiet, but it will be marked disabled
    add_run(db, "rss-refresh", "schedule", now - timedelta(hours=3))
    # state-cleanup, daily at 03:15: a day and a half ago is overdue whatever the hour
    add_run(db, "state-cleanup", "schedule", now - timedelta(hours=36))


@pytest.fixture
def svc(db_url: str, make_services: Callable[..., Services]) -> Services:
    return make_services(db_url)


def test_the_api_shows_overdue_with_expected_and_last_times_and_the_mark_is_audited(
        svc: Services) -> None:
    now = utcnow()
    seed(svc.db, now)
    client = TestClient(create_app(svc), raise_server_exceptions=False)
    marked = client.put("/api/admin/jobs/rss-refresh/disabled", headers=ops(),
                        json={"reason": "feeds paused for the migration"})
    assert marked.status_code == 200, marked.text
    jobs = {j["name"]: j for j in client.get("/api/admin/jobs", headers=ops()).json()["jobs"]}
    flush = jobs["metering-flush"]
    assert flush["state"] == "overdue"
    assert flush["lastScheduledRunAt"] == iso_z(now - timedelta(minutes=20))
    assert flush["expectedRunAt"] == iso_z(now - timedelta(minutes=15))
    assert flush["overdueAt"] == iso_z(now - timedelta(minutes=10))
    assert flush["lastRun"]["trigger"] == "admin", "the last run of any kind is still shown"
    assert jobs["delivery-drain"]["state"] == "ok"
    assert jobs["ledger-redrive"]["state"] == "ok"
    assert jobs["state-cleanup"]["state"] == "overdue"
    assert jobs["history-sample"]["state"] == "never"
    assert jobs["rss-refresh"]["state"] == "disabled"
    assert jobs["rss-refresh"]["disabled"]["by"] == "ops-1"
    assert jobs["rss-refresh"]["disabled"]["reason"] == "feeds paused for the migration"
    [audit] = [r for r in RunStore(svc.db).recent_audit() if r["action"] == "rss-refresh:disable"]
    assert (audit["actor"], audit["outcome"]) == ("ops-1", "200")
    # taking the mark off: overdue again; a bad body is a 400, not a mark
    assert client.delete("/api/admin/jobs/rss-refresh/disabled", headers=ops()).json()[
        "wasDisabled"] is True
    again = client.get("/api/admin/jobs", headers=ops()).json()["jobs"]
    assert next(j for j in again if j["name"] == "rss-refresh")["state"] == "overdue"
    for body in ({"reason": ""}, {"reason": "x" * 201}, {"why": "no"}, ["reason"]):
        answer = client.put("/api/admin/jobs/rss-refresh/disabled", headers=ops(), json=body)
        assert answer.status_code == 400, (body, answer.text)
    assert client.put("/api/admin/jobs/rss-refresh/disabled",
                      json={"reason": "r"}).status_code == 401


def test_sluice_jobs_shows_overdue_and_the_cli_marks_are_audited(
        svc: Services, db_url: str, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    now = utcnow()
    seed(svc.db, now)
    for key, value in {**BASE_ENV, "SLUICE_DATABASE_URL": db_url}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))

    def run(*argv: str) -> tuple[int, str]:
        code = main(list(argv))
        return code, capfd.readouterr().out

    assert run("schedule", "disable", "rss-refresh", "--reason", "paused", "--by", "op-2")[0] == 0
    code, out = run("jobs", "--json")
    rows = {row["job"]: row for row in json.loads(out)}
    assert code == 0 and rows["metering-flush"]["state"] == "overdue"
    assert rows["metering-flush"]["expectedRunAt"] == iso_z(now - timedelta(minutes=15))
    assert rows["rss-refresh"]["state"] == "disabled"
    assert rows["rss-refresh"]["disabled"]["by"] == "op-2"
    code, out = run("jobs")
    [line] = [line for line in out.splitlines() if line.startswith("  overdue:")
              and iso_z(now - timedelta(minutes=15)) in line]
    assert "metering-flush" in out.splitlines()[out.splitlines().index(line) - 1]
    assert "disabled on purpose by op-2" in out
    assert run("schedule", "enable", "rss-refresh")[0] == 0
    assert run("schedule", "disable", "nope", "--reason", "x")[0] == 64
    actions = [(r["action"], r["actor"], r["outcome"]) for r in RunStore(svc.db).recent_audit()]
    assert ("rss-refresh:disable", "op-2", "disabled") in actions
    assert any(a == "rss-refresh:enable" and o == "enabled" for a, _, o in actions)


def test_a_run_recorded_by_a_clock_ahead_does_not_hide_a_stopped_job(svc: Services) -> None:
    """The newest scheduled run is judged no later than now: one run stamped a day ahead (a
    host whose clock ran fast) neither counts as the last run nor keeps the job ``ok``."""
    now = utcnow()
    add_run(svc.db, "metering-flush", "schedule", now - timedelta(minutes=20))
    add_run(svc.db, "metering-flush", "schedule", now + timedelta(days=1))
    client = TestClient(create_app(svc), raise_server_exceptions=False)

    jobs = {j["name"]: j for j in client.get("/api/admin/jobs", headers=ops()).json()["jobs"]}

    flush = jobs["metering-flush"]
    assert flush["state"] == "overdue"
    assert flush["lastScheduledRunAt"] == iso_z(now - timedelta(minutes=20))
    assert flush["overdueAt"] == iso_z(now - timedelta(minutes=10))
