"""The last run per job: the latest row of each job, read by one index probe per job."""

from __future__ import annotations

from datetime import timedelta

from sluice.jobs.runs import Q, RunStore
from sluice.store.db import Database, utcnow


def test_last_runs_returns_the_latest_run_of_every_job(db: Database) -> None:
    now = utcnow()
    with db.transaction() as tx:
        tx.executemany(
            "INSERT INTO job_runs (id, job, trigger, started_at, outcome) "
            "VALUES (:id, :job, 'cli', :at, :outcome)",
            [{"id": f"{job}-{i}", "job": job, "at": now - timedelta(minutes=i),
              "outcome": "ok" if i else "failures"}
             for job in ("state-cleanup", "delivery-drain") for i in range(5)])
    last = RunStore(db).last_runs()
    assert set(last) == {"state-cleanup", "delivery-drain"}
    assert last["state-cleanup"]["outcome"] == "failures"
    assert last["delivery-drain"]["started_at"] == now
    assert RunStore(db).last_runs(["delivery-drain"]).keys() == {"delivery-drain"}


def test_the_last_run_query_is_an_index_probe(db: Database) -> None:
    sql = Q.last_runs.for_dialect(db.dialect)
    with db.transaction() as tx:
        jobs = {"jobs": tx.json(["x", "y"])}
        if db.dialect == "sqlite":
            plan = " ".join(str(r["detail"]) for r in
                            tx.fetchall("EXPLAIN QUERY PLAN " + sql, jobs))
            assert "USING INDEX job_runs_job_started_idx" in plan, plan
            assert "TEMP B-TREE" not in plan, plan
        else:
            tx.execute("SET LOCAL enable_seqscan = off")
            plan = " ".join(str(next(iter(r.values()))) for r in
                            tx.fetchall("EXPLAIN " + sql, jobs))
            assert "job_runs_job_started_idx" in plan, plan
            assert "Sort" not in plan and "SubPlan" not in plan, plan
