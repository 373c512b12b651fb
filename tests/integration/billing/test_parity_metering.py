"""metering-flush as the reference documents describe it, run as the job through the job
runner against the local Polar stand-in: one row and one request at a time (or a few events
a request, still one request at a time), and which rows are eligible."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sluice.core.services import Services
from sluice.jobs.registry import JOBS
from sluice.jobs.runner import run_job
from tests.integration.billing.test_metering_flush import rows, seed
from tests.providers.polar import PolarStandIn


def polar_services(make_services: Callable[..., Services], url: str, polar: PolarStandIn,
                   **env: str) -> Services:
    return make_services(url, POLAR_ACCESS_TOKEN=polar.token, POLAR_API_URL=polar.url, **env)


@pytest.mark.parametrize(("per_request", "requests"), [(None, 12), ("5", 3)])
def test_rows_go_to_polar_oldest_first_one_request_at_a_time(
        per_request: str | None, requests: int, db_url: str, polar: PolarStandIn,
        make_services: Callable[..., Services]) -> None:
    env = {"SLUICE_METERING_EVENTS_PER_REQUEST": per_request} if per_request else {}
    services = polar_services(make_services, db_url, polar, **env)
    seed(services.db, 12)
    outcome = run_job(JOBS["metering-flush"], services, "schedule")
    assert outcome.body == {"processed": 12, "failed": 0, "skipped": 0, "reason": None}
    assert (polar.requests, polar.max_in_flight) == (requests, 1)
    assert list(polar.events) == [f"use-{i:05d}:metering" for i in range(12)]


def test_a_run_takes_pending_rows_and_failed_rows_with_attempts_left(
        db_url: str, polar: PolarStandIn, make_services: Callable[..., Services]) -> None:
    services = polar_services(make_services, db_url, polar)
    seed(services.db, 4)
    states = {"use-00001": ("failed", 4), "use-00002": ("failed", 5),
              "use-00003": ("processed", 1)}  # use-00000 stays pending
    with services.db.transaction() as tx:
        tx.executemany("UPDATE ai_usage_metering_outbox SET status = :status, "
                       "attempt_count = :attempts WHERE ledger_id = :id",
                       [{"id": i, "status": st, "attempts": n} for i, (st, n) in states.items()])
    body = run_job(JOBS["metering-flush"], services, "schedule").body
    assert body["processed"] == 2
    assert set(polar.events) == {"use-00000:metering", "use-00001:metering"}
    assert rows(services.db)["use-00002"]["status"] == "failed"
