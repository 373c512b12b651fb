"""metering-flush against the local Polar stand-in, on both SQL backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sluice.billing.metering import IN_FLIGHT_NOTE, OutboxStore, PolarClient, flush
from sluice.billing.usage import MAX_METERING_ATTEMPTS, insert_entries
from sluice.core.services import Services
from sluice.egress import Egress
from sluice.jobs.registry import JOBS, Deadline
from sluice.jobs.runner import run_job
from sluice.store.db import Database, open_database
from tests.conftest import free_port
from tests.integration.billing.usage_data import T0, entry
from tests.providers.polar import PolarStandIn


@pytest.fixture
def store(db_url: str) -> Iterator[Database]:
    database = open_database(db_url)
    yield database
    database.close()


@pytest.fixture
def http() -> Iterator[Egress]:
    with Egress(timeout_s=5) as client:
        yield client


def seed(db: Database, n: int, start: int = 0) -> None:
    insert_entries(db, [entry(i) for i in range(start, start + n)])


def rows(db: Database) -> dict[str, dict[str, Any]]:
    with db.transaction() as tx:
        return {r["ledger_id"]: r for r in tx.fetchall("SELECT * FROM ai_usage_metering_outbox")}


def do_flush(db: Database, polar: PolarStandIn, http: Egress, *, token: str | None = None,
             url: str | None = None, **kwargs: Any) -> dict[str, Any]:
    client = PolarClient(url or polar.url, token or polar.token, client=http)
    return flush(OutboxStore(db), client, now=T0, deadline=Deadline(60), **kwargs)


def test_each_row_is_sent_once_oldest_first_one_request_at_a_time(
        store: Database, polar: PolarStandIn, http: Egress) -> None:
    seed(store, 12)
    result = do_flush(store, polar, http)
    assert result == {"processed": 12, "failed": 0, "skipped": 0, "reason": None}
    assert polar.requests == 12 and polar.max_in_flight == 1
    assert list(polar.events) == [f"use-{i:05d}:metering" for i in range(12)]
    assert polar.events["use-00003:metering"] == {
        "name": "ai_usage", "external_customer_id": "t0", "external_id": "use-00003:metering",
        "timestamp": "2026-03-01T12:00:03.000Z",
        "metadata": {"model": "gpt-4.1-mini", "input_tokens": 103, "output_tokens": 20,
                     "total_tokens": 123, "cost_micros": 1003, "ledger_id": "use-00003"}}
    for row in rows(store).values():
        assert (row["status"], row["attempt_count"], row["last_error"]) == ("processed", 1, None)
        assert row["processed_at"] == T0
    assert do_flush(store, polar, http)["processed"] == 0


def test_a_run_keeps_going_past_100_rows_until_the_outbox_is_empty(
        store: Database, polar: PolarStandIn, http: Egress) -> None:
    seed(store, 230)
    assert do_flush(store, polar, http)["processed"] == 230
    assert polar.max_in_flight == 1


def test_a_run_stops_paging_at_its_deadline(store: Database, polar: PolarStandIn,
                                            http: Egress) -> None:
    seed(store, 150)
    ticks = iter(range(10_000))  # one tick per look at the clock: 120 requests fit
    deadline = Deadline(121, clock=lambda: float(next(ticks)))
    client = PolarClient(polar.url, polar.token, client=http)
    result = flush(OutboxStore(store), client, now=T0, deadline=deadline)
    assert result == {"processed": 120, "failed": 0, "skipped": 30, "reason": "deadline"}


def test_eligible_rows_are_pending_or_failed_with_attempts_left(
        store: Database, polar: PolarStandIn, http: Egress) -> None:
    seed(store, 4)
    with store.transaction() as tx:
        tx.execute("UPDATE ai_usage_metering_outbox SET status = 'failed', attempt_count = 4 "
                   "WHERE ledger_id = 'use-00001'")
        tx.execute("UPDATE ai_usage_metering_outbox SET status = 'failed', attempt_count = 5 "
                   "WHERE ledger_id = 'use-00002'")
        tx.execute("UPDATE ai_usage_metering_outbox SET status = 'processed' "
                   "WHERE ledger_id = 'use-00003'")
    assert do_flush(store, polar, http)["processed"] == 2
    assert set(polar.events) == {"use-00000:metering", "use-00001:metering"}
    assert rows(store)["use-00002"]["status"] == "failed"


def test_a_transient_answer_fails_the_row_for_the_next_run(
        store: Database, polar: PolarStandIn, http: Egress) -> None:
    seed(store, 3)
    polar.answers.append((503, "upstream unavailable", {}))
    result = do_flush(store, polar, http)
    assert result == {"processed": 2, "failed": 1, "skipped": 0, "reason": None}
    first = rows(store)["use-00000"]
    assert (first["status"], first["attempt_count"]) == ("failed", 1)
    assert first["last_error"].startswith("polar 503")
    again = do_flush(store, polar, http)
    assert again["processed"] == 1
    assert rows(store)["use-00000"]["attempt_count"] == 2


@pytest.mark.parametrize("status", [408, 425, 500, 502, 504])
def test_repeated_transient_answers_end_the_run(store: Database, polar: PolarStandIn,
                                                http: Egress, status: int) -> None:
    seed(store, 10)
    polar.answers.extend([(status, {"detail": "busy"}, {})] * 3)
    result = do_flush(store, polar, http)
    assert result == {"processed": 0, "failed": 3, "skipped": 7, "reason": "provider_unavailable"}
    assert polar.requests == 3
    assert all(r["attempt_count"] == 0 for r in rows(store).values()), "an outage counts nothing"


def test_an_outage_of_many_runs_fails_no_row_for_good(store: Database, polar: PolarStandIn,
                                                       http: Egress) -> None:
    seed(store, 4)
    for _ in range(MAX_METERING_ATTEMPTS * 2):
        polar.answers.extend([(503, "down", {})] * 3)
        assert do_flush(store, polar, http)["reason"] == "provider_unavailable"
    assert {r["attempt_count"] for r in rows(store).values()} == {0}
    assert do_flush(store, polar, http)["processed"] == 4


def test_an_outage_met_by_a_lone_row_run_after_run_counts_nothing(
        store: Database, polar: PolarStandIn, http: Egress) -> None:
    # GIVEN one row, and Polar answering 500 to each run's one request
    seed(store, 1)
    for _ in range(MAX_METERING_ATTEMPTS + 1):
        polar.answers.append((500, "internal error", {}))
        # WHEN each run ends on that answer (no success followed it)
        assert do_flush(store, polar, http)["failed"] == 1
    # THEN the row kept its attempts, and goes once Polar is back
    assert rows(store)["use-00000"]["attempt_count"] == 0
    assert do_flush(store, polar, http)["processed"] == 1


def test_a_5xx_between_successes_counts_against_its_row(store: Database, polar: PolarStandIn,
                                                         http: Egress) -> None:
    seed(store, 3)
    polar.answers.extend([(200, {"inserted": 1, "duplicates": 0}, {}), (502, "bad gateway", {})])
    result = do_flush(store, polar, http)
    assert (result["processed"], result["failed"], result["reason"]) == (2, 1, None)
    assert rows(store)["use-00001"]["attempt_count"] == 1


def test_retry_after_ends_the_run_as_rate_limited(store: Database, polar: PolarStandIn,
                                                  http: Egress) -> None:
    seed(store, 5)
    polar.answers.append((429, {"detail": "slow down"}, {"Retry-After": "30"}))
    result = do_flush(store, polar, http)
    assert result == {"processed": 0, "failed": 1, "skipped": 4, "reason": "rate_limited"}
    assert polar.requests == 1
    assert rows(store)["use-00000"]["attempt_count"] == 0, "a rate limit counts nothing"
    assert do_flush(store, polar, http)["processed"] == 5


def test_a_permanent_answer_uses_up_the_row(store: Database, polar: PolarStandIn,
                                            http: Egress) -> None:
    seed(store, 2)
    polar.answers.append((400, {"detail": "bad event"}, {}))
    result = do_flush(store, polar, http)
    assert result == {"processed": 1, "failed": 1, "skipped": 0, "reason": None}
    dead = rows(store)["use-00000"]
    assert (dead["status"], dead["attempt_count"]) == ("failed", MAX_METERING_ATTEMPTS)
    assert "bad event" in dead["last_error"]
    assert do_flush(store, polar, http)["processed"] == 0
    assert polar.requests == 2


def test_a_wrong_token_stops_the_run_without_spending_rows(
        store: Database, polar: PolarStandIn, http: Egress) -> None:
    seed(store, 4)
    result = do_flush(store, polar, http, token="wrong")
    assert result == {"processed": 0, "failed": 1, "skipped": 3, "reason": "polar_unauthorized"}
    assert rows(store)["use-00000"]["attempt_count"] == 0, "a wrong token counts nothing"
    assert do_flush(store, polar, http)["processed"] == 4


def test_an_unreachable_polar_is_transient(store: Database, polar: PolarStandIn,
                                           http: Egress) -> None:
    seed(store, 5)
    result = do_flush(store, polar, http, url=f"http://127.0.0.1:{free_port()}")
    assert result == {"processed": 0, "failed": 3, "skipped": 2, "reason": "provider_unavailable"}
    failed = [r for r in rows(store).values() if r["status"] == "failed"]
    assert len(failed) == 3 and all(r["last_error"].startswith("network: ") for r in failed)
    assert all(r["attempt_count"] == 0 for r in failed), "Polar was never reached"


def test_several_events_a_request_and_per_event_errors(store: Database, polar: PolarStandIn,
                                                       http: Egress) -> None:
    seed(store, 25)
    polar.refused_customers.add("t2")  # rows 2, 5, 8, ... bill tenant t2
    result = do_flush(store, polar, http, events_per_request=10)
    refused = [i for i in range(25) if i % 3 == 2]
    assert result == {"processed": 25 - len(refused), "failed": len(refused), "skipped": 0,
                      "reason": None}
    assert polar.requests == 6, "3 batches, each refused once and sent again without its bad rows"
    assert polar.max_in_flight == 1
    state = rows(store)
    for i in range(25):
        row = state[f"use-{i:05d}"]
        if i in refused:
            assert (row["status"], row["attempt_count"]) == ("failed", MAX_METERING_ATTEMPTS)
            assert "external_customer_id: Customer not found" in row["last_error"]
        else:
            assert (row["status"], row["attempt_count"]) == ("processed", 1)
    assert max(polar.received.values()) == 1


def test_the_attempt_is_counted_at_the_claim(store: Database) -> None:
    seed(store, 1)
    outbox = OutboxStore(store)
    for _ in range(MAX_METERING_ATTEMPTS):
        [claimed] = outbox.claim(10)  # a process that dies with the row in flight, 5 times
        assert claimed["ledger_id"] == "use-00000"
    row = rows(store)["use-00000"]
    assert (row["status"], row["attempt_count"], row["last_error"]) == (
        "failed", MAX_METERING_ATTEMPTS, IN_FLIGHT_NOTE)
    assert outbox.claim(10) == []


def test_the_job_through_the_cron_contract(make_services: Callable[..., Services], db_url: str,
                                           polar: PolarStandIn) -> None:
    unconfigured = run_job(JOBS["metering-flush"], make_services(db_url), "cli")
    assert unconfigured.body == {"processed": 0, "failed": 0, "skipped": 0,
                                 "reason": "polar_not_configured"}
    services = make_services(db_url, POLAR_ACCESS_TOKEN=polar.token, POLAR_API_URL=polar.url,
                             SLUICE_METERING_EVENTS_PER_REQUEST="100")
    seed(services.db, 150)
    polar.answers.append((422, {"detail": [{"loc": ["body"], "msg": "bad", "type": "x"}]}, {}))
    outcome = run_job(JOBS["metering-flush"], services, "cli")
    assert outcome.outcome == "failures", "rows that failed for good are reported"
    assert (outcome.body["processed"], outcome.body["failed"]) == (50, 100)
    second = run_job(JOBS["metering-flush"], services, "cli")
    assert second.body == {"processed": 0, "failed": 0, "skipped": 0, "reason": None}
    assert second.outcome == "ok" and polar.requests == 2


def test_an_expired_deadline_counts_what_it_did_not_reach(store: Database, polar: PolarStandIn,
                                                          http: Egress) -> None:
    seed(store, 7)
    client = PolarClient(polar.url, polar.token, client=http)
    result = flush(OutboxStore(store), client, now=T0, deadline=Deadline(0))
    assert result == {"processed": 0, "failed": 0, "skipped": 7, "reason": "deadline"}
    assert polar.requests == 0
