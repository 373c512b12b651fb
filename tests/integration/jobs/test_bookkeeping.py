"""A run's bookkeeping: two transactions (lease + record, finish + release); a skip, one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

from sluice.core.services import Services
from sluice.jobs.registry import Job, JobContext
from sluice.jobs.runner import run_job
from sluice.jobs.runs import RunStore, lease_holder_id
from sluice.store.db import Tx, utcnow


class CountingDatabase:
    """The real database, counting the transactions opened through it."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.dialect = db.dialect
        self.count = 0

    def transaction(self) -> AbstractContextManager[Tx]:
        self.count += 1
        return self.db.transaction()

    def close(self) -> None:
        self.db.close()


def noop(ctx: JobContext) -> dict[str, Any]:
    return {"ok": True}


def crash(ctx: JobContext) -> dict[str, Any]:
    raise RuntimeError("drain exploded")


def job(target: str) -> Job:
    return Job(name=f"test-{target}", route=f"/api/admin/test/{target}", schedule="rate(1 day)",
               surface="state", target=f"{__name__}:{target}")


def counted(services: Services) -> Iterator[CountingDatabase]:
    counting = CountingDatabase(services.db)
    services.db = counting  # type: ignore[assignment]
    try:
        yield counting
    finally:
        services.db = counting.db


def test_a_run_costs_two_transactions_and_leaves_no_lease(services: Services) -> None:
    for target, status, outcome in (("noop", 200, "ok"), ("crash", 500, "error")):
        for counting in counted(services):
            result = run_job(job(target), services, "cli", request_id=f"req-{target}")
            assert (result.status, result.outcome) == (status, outcome)
            assert counting.count == 2
        store = RunStore(services.db)
        [run] = store.recent(f"test-{target}")
        assert run["outcome"] == outcome and run["finished_at"] is not None
        # The lease went with the finish: the next run takes it at once.
        assert store.acquire_lease(f"test-{target}", lease_holder_id(), timedelta(minutes=1))


def test_an_already_running_answer_costs_one_transaction(services: Services) -> None:
    store = RunStore(services.db)
    assert store.acquire_lease("test-noop", "elsewhere:1:held", timedelta(minutes=5))
    for counting in counted(services):
        result = run_job(job("noop"), services, "cli", request_id="req-skip")
        assert result.body == {"skipped": "already_running"} and result.outcome == "skipped"
        assert counting.count == 1
    [run] = store.recent("test-noop")
    assert run["outcome"] == "skipped" and run["result"] == {"skipped": "already_running"}


def test_a_sample_that_cannot_be_written_does_not_fail_the_run(services: Services,
                                                              caplog: Any) -> None:
    with services.db.transaction() as tx:
        tx.execute("DROP TABLE ops_samples")
    result = run_job(job("noop"), services, "cli", request_id="req-nosample")
    assert (result.status, result.outcome) == (200, "ok")
    store = RunStore(services.db)
    [run] = store.recent("test-noop")
    assert run["outcome"] == "ok" and run["finished_at"] is not None
    assert store.acquire_lease("test-noop", lease_holder_id(), timedelta(minutes=1))
    assert any("test-noop.history_sample" in r.getMessage() for r in caplog.records)


def test_last_runs_gives_each_jobs_latest_run(services: Services) -> None:
    store = RunStore(services.db)
    base = utcnow()
    for job_name, minutes, outcome in (("a", 3, "ok"), ("a", 1, "error"), ("a", 2, "ok"),
                                       ("b", 5, "skipped"), ("c", 0, "ok")):
        run_id = store.start(f"test-{job_name}", "cli", f"req-{job_name}-{minutes}",
                             base - timedelta(minutes=minutes))
        store.finish(run_id, outcome, {}, base - timedelta(minutes=minutes))
    last = store.last_runs(["test-a", "test-b", "test-missing"])
    assert set(last) == {"test-a", "test-b"}  # only the jobs asked for, and only those that ran
    assert last["test-a"]["started_at"] == base - timedelta(minutes=1)
    assert last["test-a"]["outcome"] == "error" and last["test-b"]["outcome"] == "skipped"
    assert store.last_runs() == {}  # by default the registered jobs, none of which ran here
