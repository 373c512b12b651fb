"""state-cleanup on both backends: what goes, what stays, in bounded batches."""

from __future__ import annotations

from datetime import timedelta

from sluice.jobs.cleanup import THRESHOLD_FIRING_PREFIX, cleanup_state
from sluice.jobs.registry import Deadline
from sluice.store.db import utcnow


def _seed(db, now) -> None:  # type: ignore[no-untyped-def]
    with db.transaction() as tx:
        rows = [{"key": f"expired:{i}", "value": tx.json({"i": i}),
                 "expires_at": now - timedelta(minutes=i + 1), "now": now} for i in range(25)]
        rows += [{"key": "fresh", "value": tx.json(1), "expires_at": now + timedelta(hours=1),
                  "now": now},
                 {"key": "forever", "value": tx.json(1), "expires_at": None, "now": now}]
        tx.executemany("INSERT INTO platform_state (key, value, expires_at, updated_at) "
                       "VALUES (:key, :value, :expires_at, :now)", rows)
        old, young = now - timedelta(days=91), now - timedelta(days=89)
        hashes = [{"key": f"{THRESHOLD_FIRING_PREFIX}t{i}", "field": "f", "at": old}
                  for i in range(7)]
        hashes += [{"key": f"{THRESHOLD_FIRING_PREFIX}young", "field": "f", "at": young},
                   {"key": "platform:other-hash:t1", "field": "f", "at": old},
                   {"key": "platform:ai-envelope-threshold-firingsX:t1", "field": "f", "at": old}]
        tx.executemany("INSERT INTO platform_state_hash (key, field, value, updated_at) "
                       "VALUES (:key, :field, '1', :at)", hashes)


def _keys(db, table: str) -> set[str]:  # type: ignore[no-untyped-def]
    with db.transaction() as tx:
        return {r["key"] for r in tx.fetchall(f"SELECT key FROM {table}")}


def test_cleanup_deletes_exactly_the_expired_and_stale_rows(db) -> None:  # type: ignore[no-untyped-def]
    now = utcnow()
    _seed(db, now)
    result = cleanup_state(db, now=now, deadline=Deadline(60), batch_size=4)
    assert result["deleted"] == 25
    assert result["deletedHashRecords"] == 7
    assert result["processedAt"].endswith("Z")
    assert _keys(db, "platform_state") == {"fresh", "forever"}
    assert _keys(db, "platform_state_hash") == {
        f"{THRESHOLD_FIRING_PREFIX}young", "platform:other-hash:t1",
        "platform:ai-envelope-threshold-firingsX:t1"}
    again = cleanup_state(db, now=now, deadline=Deadline(60), batch_size=4)
    assert (again["deleted"], again["deletedHashRecords"]) == (0, 0)


def test_an_expired_deadline_stops_before_the_first_batch(db) -> None:  # type: ignore[no-untyped-def]
    now = utcnow()
    _seed(db, now)
    result = cleanup_state(db, now=now, deadline=Deadline(0), batch_size=4)
    assert (result["deleted"], result["deletedHashRecords"]) == (0, 0)
    assert len(_keys(db, "platform_state")) == 27


def _seed_runs_and_audit(db, now) -> None:  # type: ignore[no-untyped-def]
    with db.transaction() as tx:
        runs = [{"id": f"r{i}", "at": now - timedelta(days=days)}
                for i, days in enumerate([1, 89, 91, 200, 500])]
        tx.executemany("INSERT INTO job_runs (id, job, trigger, started_at, outcome) "
                       "VALUES (:id, 'state-cleanup', 'cli', :at, 'ok')", runs)
        audit = [{"id": f"a{i}", "at": now - timedelta(days=days)}
                 for i, days in enumerate([1, 399, 401, 900])]
        tx.executemany("INSERT INTO admin_audit (id, actor, action, outcome, at) "
                       "VALUES (:id, 'x', 'flags:set', '200', :at)", audit)


def _ids(db, table: str) -> set[str]:  # type: ignore[no-untyped-def]
    with db.transaction() as tx:
        return {r["id"] for r in tx.fetchall(f"SELECT id FROM {table}")}


def test_cleanup_prunes_job_runs_and_the_audit_trail_past_their_retention(db) -> None:  # type: ignore[no-untyped-def]
    now = utcnow()
    _seed_runs_and_audit(db, now)
    result = cleanup_state(db, now=now, deadline=Deadline(60), batch_size=2)
    assert (result["deletedJobRuns"], result["deletedAuditRecords"]) == (3, 2)
    assert _ids(db, "job_runs") == {"r0", "r1"}
    assert _ids(db, "admin_audit") == {"a0", "a1"}
    shorter = cleanup_state(db, now=now, deadline=Deadline(60), runs_retention_days=1,
                            audit_retention_days=30)
    assert (shorter["deletedJobRuns"], shorter["deletedAuditRecords"]) == (1, 1)


def test_the_retention_settings_default_long_for_the_audit_trail() -> None:
    from sluice.core.settings import Settings

    assert Settings.from_env({}).audit_retention_days == 400
    assert Settings.from_env({}).job_runs_retention_days == 90
    custom = Settings.from_env({"SLUICE_AUDIT_RETENTION_DAYS": "730",
                                "SLUICE_JOB_RUNS_RETENTION_DAYS": "30"})
    assert (custom.audit_retention_days, custom.job_runs_retention_days) == (730, 30)
