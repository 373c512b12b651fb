"""The job list's per-job lookups are index seeks, so ``GET /api/admin/jobs`` costs the same
with a short or a long run history, on both backends. Measured as work, not time: the rows
Postgres reads from ``job_runs`` (``EXPLAIN ANALYZE``), the statements SQLite's virtual
machine steps through (a progress handler). The history that made it grow: a job whose
newest scheduled run is far behind many runs of other triggers (or that has none)."""

from __future__ import annotations

import json
import sqlite3
from datetime import timedelta
from typing import Any

from sluice.jobs.runs import Q
from sluice.store.db import Database, utcnow
from tests.store_work import sqlite_steps as steps_of

JOBS = ["metering-flush", "history-sample"]
SCHEDULED_INDEX = "job_runs_scheduled_idx"


def history(db: Database, runs: int) -> None:
    """``metering-flush``: one scheduled run a day ago, then ``runs`` admin runs; and
    ``history-sample``: ``runs`` command-line runs, never a scheduled one."""
    now = utcnow()
    rows = [{"id": "flush-scheduled", "job": "metering-flush", "trigger": "schedule",
             "at": now - timedelta(days=1)}]
    for n in range(runs):
        at = now - timedelta(minutes=n)
        rows.append({"id": f"flush-{n}", "job": "metering-flush", "trigger": "admin", "at": at})
        rows.append({"id": f"sample-{n}", "job": "history-sample", "trigger": "cli", "at": at})
    with db.transaction() as tx:
        tx.executemany("INSERT INTO job_runs (id, job, trigger, started_at, outcome) "
                       "VALUES (:id, :job, :trigger, :at, 'ok')", rows)


def sqlite_steps(db: Database) -> tuple[int, str]:
    """The virtual-machine steps of the newest-scheduled-run lookup, and its plan."""
    sql = Q.last_scheduled_runs.for_dialect("sqlite")
    params = {"jobs": json.dumps(JOBS), "now": utcnow()}
    steps, found = steps_of(db.path, sql, params)  # type: ignore[attr-defined]
    conn = sqlite3.connect(db.path)  # type: ignore[attr-defined]
    try:
        plan = " ".join(str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
    finally:
        conn.close()
    assert [r[0] for r in found] == ["metering-flush"]
    return steps, plan


def postgres_rows_read(db: Database) -> tuple[int, str]:
    """The rows the lookup read from ``job_runs`` (returned or filtered out), and its plan:
    one job at a time, so each scan runs once and its counts are exact, not per-loop means."""
    sql = Q.last_scheduled_runs.for_dialect("postgres")
    read, indexes = 0, []

    def walk(node: dict[str, Any]) -> None:
        nonlocal read
        if "Index Name" in node:
            indexes.append(str(node["Index Name"]))
        if node.get("Relation Name") == "job_runs":
            assert node["Actual Loops"] == 1, node
            read += int(node["Actual Rows"]) + int(node.get("Rows Removed by Filter", 0))
        for child in node.get("Plans", []):
            walk(child)

    for job in JOBS:
        with db.transaction() as tx:
            params = {"jobs": tx.json([job]), "now": utcnow()}
            [row] = tx.fetchall("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        [top] = next(iter(row.values()))
        walk(top["Plan"])
    return read, " ".join(indexes)


def work(db: Database) -> tuple[int, str]:
    return sqlite_steps(db) if db.dialect == "sqlite" else postgres_rows_read(db)


def test_the_newest_scheduled_run_is_an_index_seek_whatever_the_history(db: Database) -> None:
    history(db, 100)
    short, plan = work(db)
    with db.transaction() as tx:
        tx.execute("DELETE FROM job_runs")
    history(db, 5000)
    with db.transaction() as tx:  # the planners' statistics, as a settled database has them
        tx.execute("ANALYZE job_runs" if db.dialect == "postgres" else "ANALYZE")
    long, plan_long = work(db)

    # a seek deepens with the B-tree (a level or two from 100 to 5,000 runs a job); a walk
    # of the job's runs grows fifty-fold
    assert long < short * 1.5, f"{short} with 100 runs a job, {long} with 5,000"
    assert SCHEDULED_INDEX in plan and SCHEDULED_INDEX in plan_long, (plan, plan_long)
    if db.dialect == "postgres":
        assert long <= len(JOBS), "at most one row read a job"
