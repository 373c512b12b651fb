"""A run that lost its lease stops before its next side effect; a run that never finished
does not stay `running`; Postgres cannot hold a drain past its time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from sluice.billing.usage import insert_entries
from sluice.core.services import Services
from sluice.jobs.registry import JOBS
from sluice.jobs.runner import run_job
from sluice.jobs.runs import RunStore
from sluice.store.db import Database, utcnow
from tests.integration.billing.usage_data import entry
from tests.providers.polar import PolarStandIn


def outbox(db: Database) -> dict[str, dict[str, Any]]:
    with db.transaction() as tx:
        return {r["ledger_id"]: r for r in tx.fetchall("SELECT * FROM ai_usage_metering_outbox")}


def take_over_lease(db: Database, job: str) -> None:
    """What a second run does once this run's lease has lapsed."""
    with db.transaction() as tx:
        tx.execute("UPDATE job_leases SET holder = 'another-run', expires_at = :later "
                   "WHERE job = :job", {"job": job, "later": utcnow().replace(year=2100)})


def test_a_run_that_lost_its_lease_settles_nothing_and_sends_nothing_more(
        db_url: str, make_services: Callable[..., Services], polar: PolarStandIn) -> None:
    services = make_services(db_url, POLAR_ACCESS_TOKEN=polar.token, POLAR_API_URL=polar.url)
    insert_entries(services.db, [entry(i) for i in range(3)])
    polar.on_request = lambda: take_over_lease(services.db, "metering-flush")

    outcome = run_job(JOBS["metering-flush"], services, "cli")

    assert outcome.outcome == "error"
    assert outcome.body["error"]["cause"] == "lease_lost"
    assert polar.requests == 1, "the run stopped before its next send"
    rows = outbox(services.db)
    assert rows["use-00000"]["status"] == "failed", "not settled over the new holder's work"
    assert [rows[f"use-{i:05d}"]["attempt_count"] for i in (1, 2)] == [0, 0]


def test_a_run_that_never_finished_is_marked_abandoned_by_the_next(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(db_url)
    runs = RunStore(services.db)
    killed = runs.start("state-cleanup", "schedule", "req-killed", utcnow())
    outcome = run_job(JOBS["state-cleanup"], services, "cli")
    assert outcome.outcome == "ok"
    recent = {r["id"]: r for r in runs.recent("state-cleanup")}
    assert recent[killed]["outcome"] == "error"
    assert recent[killed]["result"]["error"]["code"] == "abandoned"
    assert recent[killed]["finished_at"] is not None
    assert [r["outcome"] for r in recent.values() if r["id"] != killed] == ["ok"]


def test_every_job_on_a_bare_install_is_ok_with_nothing_to_page(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(db_url)  # no Redis, no Polar, no delivery channel
    for job in JOBS.values():
        outcome = run_job(job, services, "cli")
        assert (job.name, outcome.outcome) == (job.name, "ok"), outcome.body
        assert job.failures(outcome.body) == 0
    reasons = {name: run_job(JOBS[name], services, "cli").body.get("reason")
               for name in ("metering-flush", "ledger-redrive")}
    assert reasons == {"metering-flush": "polar_not_configured",
                       "ledger-redrive": "redis_not_configured"}


def test_a_held_table_lock_cannot_keep_a_drain_past_its_time(
        pg_url: str, make_services: Callable[..., Services], polar: PolarStandIn) -> None:
    services = make_services(pg_url, POLAR_ACCESS_TOKEN=polar.token, POLAR_API_URL=polar.url,
                             SLUICE_DEADLINE_MARGIN_SECONDS="0")
    insert_entries(services.db, [entry(i) for i in range(2)])
    ticks = iter([0.0] + [49.7] * 1000)  # the run starts, then finds 0.3 s of budget left
    holder = psycopg.connect(pg_url)
    try:
        holder.execute("LOCK TABLE ai_usage_metering_outbox IN ACCESS EXCLUSIVE MODE")
        outcome = run_job(JOBS["metering-flush"], services, "cli",
                          deadline_clock=lambda: next(ticks))
    finally:
        holder.rollback()
        holder.close()
    assert outcome.outcome == "error"
    assert outcome.body["error"]["cause"] == "store_unavailable"
    assert "timeout" in outcome.body["error"]["message"]
    assert polar.requests == 0
    assert {r["attempt_count"] for r in outbox(services.db).values()} == {0}
    [run] = RunStore(services.db).recent("metering-flush")
    assert run["outcome"] == "error" and run["finished_at"] is not None
