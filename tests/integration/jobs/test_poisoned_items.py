"""One bad row never stops state-cleanup: a kind of row the store refuses to delete fails
that kind, named with its reason, and every other kind is still cleaned."""

from __future__ import annotations

from datetime import timedelta

from sluice.jobs.cleanup import THRESHOLD_FIRING_PREFIX, cleanup_state
from sluice.jobs.registry import JOBS, Deadline
from sluice.store.db import Database, utcnow


def test_a_row_the_store_refuses_to_delete_fails_its_kind_alone(db: Database) -> None:
    now = utcnow()
    with db.transaction() as tx:
        tx.executemany("INSERT INTO platform_state (key, value, expires_at, updated_at) "
                       "VALUES (:key, '1', :at, :at)",
                       [{"key": f"expired:{i}", "at": now - timedelta(minutes=1)}
                        for i in range(3)])
        tx.executemany("INSERT INTO platform_state_hash (key, field, value, updated_at) "
                       "VALUES (:key, 'f', '1', :at)",
                       [{"key": f"{THRESHOLD_FIRING_PREFIX}t{i}", "at": now - timedelta(days=91)}
                        for i in range(2)])
        # Something else still points at one expired row: its delete breaks a constraint.
        tx.execute("CREATE TABLE poison_ref (key text REFERENCES platform_state (key))")
        tx.execute("INSERT INTO poison_ref (key) VALUES ('expired:1')")

    result = cleanup_state(db, now=now, deadline=Deadline(60), batch_size=10)

    assert result["failed"] == 1 and JOBS["state-cleanup"].failures(result) == 1
    [error] = result["errors"]
    assert error.startswith("state: constraint_violation")
    assert result["deletedHashRecords"] == 2, "the other kinds were cleaned"
    again = cleanup_state(db, now=now, deadline=Deadline(60), batch_size=10)
    assert again["failed"] == 1 and again["deletedHashRecords"] == 0
