"""The run's own bookkeeping (its lease, its run record) is bounded by the run's time:
a store that holds a lock on it answers a typed error within the budget, not after the
store's own 30 s timeouts."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from sluice.core.services import Services
from sluice.jobs.registry import JOBS
from sluice.jobs.runner import run_job
from sluice.jobs.runs import RunStore

# The run starts at 0, then finds 0.3 s of its 50 s budget left; without the bound a
# lock wait lasts the store's 30 s ceiling.
ANSWER_WITHIN_S = 10.0


@contextmanager
def run_tables_locked(db_url: str, table: str = "job_runs") -> Iterator[None]:
    if db_url.startswith("sqlite:///"):
        holder = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # the one writer: every other write waits
        try:
            yield
        finally:
            holder.rollback()
            holder.close()
        return
    pg = psycopg.connect(db_url)
    try:
        pg.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        yield
    finally:
        pg.rollback()
        pg.close()


def test_a_store_locked_under_the_run_record_answers_a_typed_error_in_time(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(db_url, SLUICE_DEADLINE_MARGIN_SECONDS="0")
    ticks = iter([0.0] + [49.7] * 1000)
    with run_tables_locked(db_url):
        started = time.monotonic()
        outcome = run_job(JOBS["state-cleanup"], services, "cli",
                          deadline_clock=lambda: next(ticks))
        elapsed = time.monotonic() - started

    assert outcome.outcome == "error"
    assert outcome.body["error"]["cause"] == "store_unavailable"
    assert elapsed < ANSWER_WITHIN_S, f"answered after {elapsed:.1f} s"
    again = run_job(JOBS["state-cleanup"], services, "cli")
    assert again.outcome == "ok", "the next run is not blocked by the one that failed"


def test_past_its_deadline_and_margin_a_run_starts_no_statement(
        db_url: str, make_services: Callable[..., Services]) -> None:
    """The time left keeps counting down past the deadline: each statement does not get
    a fresh margin of its own."""
    services = make_services(db_url, SLUICE_DEADLINE_MARGIN_SECONDS="2")
    ticks = iter([0.0] + [53.0] * 1000)  # 50 s budget, 2 s margin: 1 s past both
    with run_tables_locked(db_url):
        outcome = run_job(JOBS["state-cleanup"], services, "cli",
                          deadline_clock=lambda: next(ticks))

    assert outcome.outcome == "error"
    assert outcome.body["error"]["cause"] == "store_unavailable"
    assert "time is up" in outcome.body["error"]["message"], outcome.body


def test_a_drain_held_by_a_lock_past_its_time_is_still_recorded_and_releases_its_lease(
        pg_url: str, make_services: Callable[..., Services]) -> None:
    """The drain's statements end half a margin before the run's own record is due.
    (Postgres: SQLite has no table locks; its one write lock holds the record too.)"""
    services = make_services(pg_url, SLUICE_DEADLINE_MARGIN_SECONDS="2")
    job = JOBS["state-cleanup"]._replace(budget_s=1.0)
    with run_tables_locked(pg_url, table="platform_state"):
        outcome = run_job(job, services, "cli")

    assert outcome.outcome == "error"
    assert outcome.body["error"]["cause"] == "store_unavailable"
    [run] = RunStore(services.db).recent("state-cleanup")
    assert run["outcome"] == "error" and run["finished_at"] is not None
    assert run_job(job, services, "cli").outcome == "ok", "the lease was released"
