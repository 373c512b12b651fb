"""write_entries as ledger-redrive uses it: one statement a batch on Postgres with the run's
fence inside, the same rows on both backends, and nothing written without the lease."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from sluice.billing.ledger_redrive import DEFAULT_REDRIVE_BATCH_SIZE, redrive
from sluice.billing.usage import metering_row, write_entries
from sluice.core.errors import LeaseLost
from sluice.jobs.registry import Deadline
from sluice.jobs.runs import Fence, RunStore
from sluice.store.db import Database, PostgresDatabase
from sluice.store.redis_clients import LEDGER_RETRY_PROCESSING, LEDGER_RETRY_QUEUE, RedisClient
from tests.integration.billing.counting import CountingDatabase
from tests.integration.billing.usage_data import T0, entry, envelope

JOB = "ledger-redrive"


def leased(db: Database, holder: str) -> Fence:
    assert RunStore(db).acquire_lease(JOB, holder, timedelta(hours=1))
    return Fence(JOB, holder)


def outbox(db: Database) -> dict[str, dict[str, Any]]:
    with db.transaction() as tx:
        return {r["ledger_id"]: {k: r[k] for k in ("id", "ledger_id", "external_customer_id",
                                                   "event_name", "metadata")}
                for r in tx.fetchall("SELECT * FROM ai_usage_metering_outbox")}


def ledger_count(db: Database) -> int:
    with db.transaction() as tx:
        row = tx.fetchone("SELECT count(*) AS n FROM ai_usage_ledger")
    assert row is not None
    return int(row["n"])


@pytest.mark.postgres
@pytest.mark.redis
def test_a_fenced_batch_costs_one_statement_on_postgres(pg_url: str,
                                                        redis_client: RedisClient) -> None:
    db = PostgresDatabase(pg_url)
    try:
        fence = leased(db, "this-run")
        redis_client.lpush(LEDGER_RETRY_QUEUE,
                           *[envelope(i) for i in range(2 * DEFAULT_REDRIVE_BATCH_SIZE)])
        counting = CountingDatabase(db)
        result = redrive(redis_client, counting, now=T0, deadline=Deadline(60), fence=fence)
        assert result["succeeded"] == 2 * DEFAULT_REDRIVE_BATCH_SIZE
        assert ledger_count(db) == 2 * DEFAULT_REDRIVE_BATCH_SIZE
    finally:
        db.close()
    assert counting.statements == ["lease_is_mine", "write_usage", "write_usage"], \
        "the fence before the first claim, then one statement a batch"


def test_postgres_builds_the_outbox_row_metering_row_builds(db: Database) -> None:
    entries = [entry(0), entry(1, tenant_id=None), entry(2, tenant_id=""),
               entry(3, tenant_id="", user_id=""), entry(4, tenant_id=None, user_id=None),
               entry(5, input_tokens=0, output_tokens=0, cost_micros=0),
               entry(6, input_tokens=0, output_tokens=0, cost_micros=7),
               entry(7, input_tokens=0, output_tokens=3, cost_micros=0)]
    written = write_entries(db, entries, fence=leased(db, "this-run"))
    assert written.inserted == {e.id for e in entries} and written.erased == set()
    expected = {e.id: row for e in entries if (row := metering_row(e))}
    assert sorted(expected) == ["use-00000", "use-00001", "use-00002", "use-00006",
                                "use-00007"]
    assert outbox(db) == expected


def test_an_entry_already_written_brings_no_second_outbox_row(db: Database) -> None:
    first = write_entries(db, [entry(0)])
    again = write_entries(db, [entry(0), entry(1)])
    assert (first.inserted, again.inserted) == ({"use-00000"}, {"use-00001"})
    assert sorted(outbox(db)) == ["use-00000", "use-00001"]


def test_a_writer_without_the_lease_writes_nothing(db: Database) -> None:
    leased(db, "another-run")
    with pytest.raises(LeaseLost):
        write_entries(db, [entry(i) for i in range(3)], fence=Fence(JOB, "this-run"))
    assert ledger_count(db) == 0 and outbox(db) == {}


@pytest.mark.redis
def test_a_run_that_lost_its_lease_mid_run_leaves_its_batch_for_the_next(
        db: Database, redis_client: RedisClient) -> None:
    fence = leased(db, "this-run")
    redis_client.lpush(LEDGER_RETRY_QUEUE, *[envelope(i) for i in range(3)])

    class TakenOver:
        """The store, whose lease another run takes over after the run's first check, as
        the claimed batch is about to land."""

        dialect = db.dialect
        opened = 0

        def transaction(self) -> Any:
            self.opened += 1
            if self.opened == 2:
                with db.transaction() as tx:
                    tx.execute("UPDATE job_leases SET holder = 'another-run' WHERE job = :job",
                               {"job": JOB})
            return db.transaction()

    with pytest.raises(LeaseLost):
        redrive(redis_client, TakenOver(), now=T0, deadline=Deadline(60), fence=fence)
    assert ledger_count(db) == 0
    assert redis_client.llen(LEDGER_RETRY_PROCESSING) == 3, "reclaimed by the next run"
    assert redis_client.llen(LEDGER_RETRY_QUEUE) == 0


def test_the_rows_are_dated_by_the_writers_clock_not_the_databases(db: Database) -> None:
    # The outbox goes oldest first by created_at: a column default would date it by the
    # database's clock, and the simulator (whose clock is not the database's) found its
    # order then depended on which rows fell in the same real millisecond.
    at = T0 - timedelta(days=400)
    write_entries(db, [entry(1), entry(2)], now=at)
    with db.transaction() as tx:
        rows = tx.fetchall("SELECT created_at FROM ai_usage_ledger UNION ALL "
                           "SELECT created_at FROM ai_usage_metering_outbox")
    assert len(rows) == 4
    assert all(row["created_at"] == at for row in rows)
