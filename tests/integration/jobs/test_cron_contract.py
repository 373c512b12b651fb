"""The cron contract on both backends: guarded, single-flight, budgeted, recorded, reported."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest

from sluice.core.services import Services
from sluice.jobs.registry import Deadline, Job, JobContext
from sluice.jobs.runner import run_job
from sluice.jobs.runs import RunStore, lease_holder_id
from sluice.store.db import utcnow

GATE = threading.Event()
ENTERED = threading.Event()
SEEN: list[JobContext] = []


def boom(ctx: JobContext) -> dict[str, Any]:
    raise KeyError("drain exploded")


def some_failures(ctx: JobContext) -> dict[str, Any]:
    return {"processed": 3, "failed": 2, "errors": ["x"]}


def record_context(ctx: JobContext) -> dict[str, Any]:
    SEEN.append(ctx)
    return {"ok": True}


def wait_for_gate(ctx: JobContext) -> dict[str, Any]:
    ENTERED.set()
    GATE.wait(10)
    return {"waited": True}


def job(target: str, **kw: Any) -> Job:
    return Job(name=f"test-{target}", route=f"/api/admin/test/{target}", schedule="rate(1 day)",
               surface="state", target=f"{__name__}:{target}", **kw)


def runs(services: Services, name: str) -> list[dict[str, Any]]:
    return RunStore(services.db).recent(name)


def test_a_crashing_drain_becomes_a_typed_500_and_is_recorded(services: Services,
                                                               caplog: Any) -> None:
    outcome = run_job(job("boom"), services, "cli", request_id="req-1")
    assert outcome.status == 500
    assert outcome.body == {"error": {"code": "internal_error", "job": "test-boom",
                                      "requestId": "req-1"}}
    [run] = runs(services, "test-boom")
    assert run["outcome"] == "error" and run["result"] == outcome.body
    assert run["trigger"] == "cli" and run["duration_ms"] is not None


def test_failures_above_zero_are_reported(services: Services, capsys: Any, caplog: Any) -> None:
    outcome = run_job(job("some_failures", failure_keys=("failed", "errors")), services, "cli")
    assert outcome.status == 200 and outcome.outcome == "failures"
    assert outcome.body == {"processed": 3, "failed": 2, "errors": ["x"]}
    assert any(r.levelname == "ERROR" and "drain reported 3 failure(s)" in r.getMessage()
               for r in caplog.records)
    blobs = [json.loads(line) for line in capsys.readouterr().err.splitlines()
             if line.startswith('{"_aws"')]
    assert any(b.get("DrainFailures") == [3.0] and b.get("job") == "test-some_failures"
               for b in blobs)
    assert runs(services, "test-some_failures")[0]["outcome"] == "failures"


def test_overlapping_runs_are_single_flight(services: Services) -> None:
    GATE.clear()
    ENTERED.clear()
    slow = job("wait_for_gate")
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(run_job(slow, services, "schedule")))
    first.start()
    assert ENTERED.wait(10)
    second = run_job(slow, services, "cron_http")
    GATE.set()
    first.join(10)
    assert second.status == 200 and second.body == {"skipped": "already_running"}
    assert results[0].body == {"waited": True}
    outcomes = sorted(r["outcome"] for r in runs(services, slow.name))
    assert outcomes == ["ok", "skipped"]
    assert run_job(slow, services, "cli").body == {"waited": True}, "the lease was released"


def test_an_expired_lease_does_not_block(services: Services) -> None:
    store = RunStore(services.db)
    assert store.acquire_lease("test-record_context", "elsewhere:1:x", timedelta(seconds=-1))
    assert run_job(job("record_context"), services, "cli").body == {"ok": True}


def test_a_live_lease_from_another_host_blocks(services: Services) -> None:
    store = RunStore(services.db)
    assert store.acquire_lease("test-record_context", "other-host:1:x", timedelta(minutes=5))
    assert run_job(job("record_context"), services, "cli").body == {"skipped": "already_running"}


def test_a_lease_of_a_dead_local_process_is_taken_over(services: Services) -> None:
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    holder = f"{socket.gethostname()}:{dead.stdout.strip()}:x"
    assert RunStore(services.db).acquire_lease("test-record_context", holder, timedelta(minutes=5))
    assert run_job(job("record_context"), services, "cli").body == {"ok": True}
    assert lease_holder_id().startswith(socket.gethostname() + ":")


@pytest.mark.parametrize(("remaining_ms", "expected"), [(None, 50.0), (600_000, 50.0),
                                                        (20_000, 15.0), (3_000, 0.0)])
def test_the_deadline_is_the_smaller_of_budget_and_lambda_time(
        services: Services, remaining_ms: int | None, expected: float) -> None:
    SEEN.clear()
    run_job(job("record_context"), services, "schedule",
            lambda_remaining_ms=(lambda: remaining_ms) if remaining_ms else None)  # type: ignore[arg-type, return-value]
    assert SEEN[0].deadline.seconds == pytest.approx(expected, abs=0.01)


def test_deadline_clock() -> None:
    now = [100.0]
    deadline = Deadline(5, clock=lambda: now[0])
    assert not deadline.expired() and deadline.remaining() == 5
    now[0] = 105.0
    assert deadline.expired() and deadline.remaining() == 0


def test_a_store_outage_is_a_typed_500(make_services: Any, tmp_path: Any) -> None:
    services = make_services(f"sqlite:///{tmp_path}/unmigrated.db")  # no tables at all
    outcome = run_job(job("record_context"), services, "cli", request_id="r")
    assert outcome.status == 500
    assert outcome.body["error"]["code"] == "internal_error"
    assert outcome.body["error"]["requestId"] == "r"


def test_every_run_is_recorded_with_its_trigger(services: Services) -> None:
    for trigger in ("schedule", "cron_http", "admin", "cli"):
        run_job(job("record_context"), services, trigger)  # type: ignore[arg-type]
    recorded = runs(services, "test-record_context")
    assert sorted(r["trigger"] for r in recorded) == ["admin", "cli", "cron_http", "schedule"]
    assert all(r["started_at"] <= utcnow() and r["outcome"] == "ok" for r in recorded)
