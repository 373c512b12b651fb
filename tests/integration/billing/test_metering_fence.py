"""The metering outbox under a run's fence: the lease check travels inside the claim and
the settle statements, and a run without its lease claims and marks nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from sluice.billing.metering import IN_FLIGHT_NOTE, IngestOutcome, OutboxStore, PolarClient, flush
from sluice.billing.usage import insert_entries
from sluice.core.errors import LeaseLost
from sluice.jobs.registry import Deadline
from sluice.jobs.runs import Fence, RunStore
from sluice.store.db import Database, PostgresDatabase
from tests.integration.billing.counting import CountingDatabase
from tests.integration.billing.usage_data import T0, entry

JOB = "metering-flush"


class AcceptingPolar(PolarClient):
    def __init__(self) -> None:
        pass

    def ingest(self, events: list[dict[str, Any]]) -> IngestOutcome:
        return IngestOutcome("ok", 202)


def statuses(db: Database) -> dict[str, tuple[str, int, str | None]]:
    with db.transaction() as tx:
        return {r["ledger_id"]: (r["status"], r["attempt_count"], r["last_error"]) for r in
                tx.fetchall("SELECT * FROM ai_usage_metering_outbox")}


def leased(db: Database, holder: str) -> Fence:
    assert RunStore(db).acquire_lease(JOB, holder, timedelta(hours=1))
    return Fence(JOB, holder)


def take_over(db: Database) -> None:
    with db.transaction() as tx:
        tx.execute("UPDATE job_leases SET holder = 'another-run' WHERE job = :job", {"job": JOB})


@pytest.mark.postgres
def test_a_fenced_row_costs_one_statement_and_one_commit_with_the_next_claim_on_postgres(
        pg_url: str) -> None:
    db = PostgresDatabase(pg_url)
    try:
        insert_entries(db, [entry(i) for i in range(3)])
        counting = CountingDatabase(db)
        result = flush(OutboxStore(counting, leased(db, "this-run")), AcceptingPolar(), now=T0,
                       deadline=Deadline(60))
    finally:
        db.close()
    assert result["processed"] == 3
    assert counting.transactions == [["claim_one_outbox"]] + [
        ["mark_and_claim_one_outbox"]] * 3 + [["lease_is_mine"]], \
        "each mark is one statement with the next claim; the empty claim that ends the run " \
        "is told apart from a lost lease by a check of its own"


def test_a_run_without_its_lease_claims_nothing(db: Database) -> None:
    insert_entries(db, [entry(i) for i in range(2)])
    leased(db, "another-run")
    with pytest.raises(LeaseLost):
        OutboxStore(db, Fence(JOB, "this-run")).claim(10)
    assert set(statuses(db).values()) == {("pending", 0, None)}


def test_a_run_that_lost_its_lease_after_the_claim_settles_nothing(db: Database) -> None:
    insert_entries(db, [entry(i) for i in range(2)])
    store = OutboxStore(db, leased(db, "this-run"))
    [first, second] = store.claim(2)
    take_over(db)
    with pytest.raises(LeaseLost):
        store.settle([first["id"]], {second["id"]: ("polar 503", "refund")}, T0)
    assert set(statuses(db).values()) == {("failed", 1, IN_FLIGHT_NOTE)}


def test_a_lease_lost_before_a_settle_with_the_next_claim_changes_nothing(
        db: Database) -> None:
    insert_entries(db, [entry(i) for i in range(2)])
    store = OutboxStore(db, leased(db, "this-run"))
    [first] = store.claim(1)
    take_over(db)
    with pytest.raises(LeaseLost):
        store.settle([first["id"]], {}, T0, then_claim=1)
    assert statuses(db) == {"use-00000": ("failed", 1, IN_FLIGHT_NOTE),
                            "use-00001": ("pending", 0, None)}


def test_the_row_marked_with_the_next_claim_is_not_claimed_again(db: Database) -> None:
    insert_entries(db, [entry(0)])
    store = OutboxStore(db, leased(db, "this-run"))
    [only] = store.claim(1)
    assert store.settle([only["id"]], {}, T0, then_claim=1) == [], \
        "the mark and the claim read one snapshot, where the marked row still looks eligible"
    assert statuses(db) == {"use-00000": ("processed", 1, None)}


def test_a_settle_with_the_next_claim_skips_the_rows_this_run_tried(db: Database) -> None:
    insert_entries(db, [entry(i) for i in range(3)])
    store = OutboxStore(db, leased(db, "this-run"))
    [first] = store.claim(1)
    [second] = store.settle([], {first["id"]: ("polar 503", "count")}, T0, then_claim=1,
                            tried={first["id"]})
    assert second["id"] == "use-00001:metering", "the failed row waits for the next run"
    [third] = store.settle([second["id"]], {}, T0, then_claim=1, tried={first["id"]})
    assert third["id"] == "use-00002:metering"
    assert store.settle([third["id"]], {}, T0, then_claim=1, tried={first["id"]}) == []
    assert statuses(db) == {"use-00000": ("failed", 1, "polar 503"),
                            "use-00001": ("processed", 1, None),
                            "use-00002": ("processed", 1, None)}


def test_a_lapsed_lease_is_lost_too(db: Database) -> None:
    insert_entries(db, [entry(0)])
    store = OutboxStore(db, leased(db, "this-run"))
    with db.transaction() as tx:
        tx.execute("UPDATE job_leases SET expires_at = :past", {"past": T0})
    with pytest.raises(LeaseLost):
        store.claim(1)
    assert statuses(db) == {"use-00000": ("pending", 0, None)}


def test_one_settle_marks_sent_failed_and_refunded_rows_together(db: Database) -> None:
    insert_entries(db, [entry(i) for i in range(4)])
    store = OutboxStore(db, leased(db, "this-run"))
    claimed = [row["id"] for row in store.claim(4)]
    assert claimed == [f"use-{i:05d}:metering" for i in range(4)], "oldest first"
    store.settle([claimed[0]], {claimed[1]: ("polar 422", "exhaust"),
                                claimed[2]: ("polar 503", "count")}, T0)
    store.settle([], {claimed[3]: ("polar 503", "refund")}, T0, refund=[claimed[2]])
    assert statuses(db) == {"use-00000": ("processed", 1, None),
                            "use-00001": ("failed", 5, "polar 422"),
                            "use-00002": ("failed", 0, "polar 503"),
                            "use-00003": ("failed", 0, "polar 503")}
