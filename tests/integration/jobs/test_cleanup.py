"""state-cleanup on both backends: what goes, what stays, in bounded batches."""

from __future__ import annotations

from datetime import timedelta

from sluice.jobs.cleanup import THRESHOLD_FIRING_PREFIX, cleanup_state
from sluice.jobs.registry import Deadline
from sluice.store.db import utcnow
from tests.integration.delivery.bulk import insert_failed


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


DESTINATION_ROWS = """
INSERT INTO delivery_destinations (key, failures, down_since, next_probe_at, paused_until,
    paused_at, disabled_at, disabled_reason, rate_limit, rate_period_s, rate_until,
    last_success_at, updated_at)
VALUES (:key, 0, :down_since, :down_since, :paused_until, :paused_at, :disabled_at,
        :disabled_reason, :rate_limit, :rate_period_s, :rate_until, :at, :at)
"""


def _destination(key: str, at, **state) -> dict[str, object]:  # type: ignore[no-untyped-def]
    row = dict.fromkeys(("down_since", "paused_until", "paused_at", "disabled_at",
                         "disabled_reason", "rate_limit", "rate_period_s", "rate_until"))
    return {**row, "key": key, "at": at, **state}


def test_cleanup_prunes_destinations_and_rates_with_nothing_left_past_the_retention(
        db) -> None:  # type: ignore[no-untyped-def]
    now = utcnow()
    old, day, later = now - timedelta(days=8), timedelta(days=1), now + timedelta(days=1)
    # GIVEN two failed entries: one to a chat, one to a URL on a webhook host
    insert_failed(db, [("telegram", "2"), ("webhook", "https://h.example/a")])
    # AND destination rows, each untouched for 8 days (the retention is 7) unless said
    rows = [
        _destination("telegram:1", old),  # a last success only, no entry: goes
        _destination("telegram:2", old),  # its entry is still there: stays
        _destination("webhook:h.example:443", old),  # the receiver of that entry: stays
        _destination("webhook:https://h.example/gone", old),  # its entries pruned: goes
        _destination("telegram:3", old, disabled_at=old, disabled_reason="gone: 410"),
        _destination("telegram:4", old, paused_until=later, paused_at=old),
        _destination("telegram:5", old, paused_until=now - day, paused_at=old),  # lapsed: goes
        _destination("telegram:6", old, down_since=old),
        _destination("telegram:7", old, rate_limit=1.0, rate_period_s=1, rate_until=later),
        _destination("telegram:8", old, rate_limit=1.0, rate_period_s=1,
                     rate_until=now - day),  # the override lapsed: goes
        _destination("telegram:9", now - 3 * day),  # touched 3 days ago: stays
    ]
    us = int(now.timestamp() * 1_000_000)
    with db.transaction() as tx:
        tx.executemany(DESTINATION_ROWS, rows)
        tx.executemany("INSERT INTO delivery_rate_limits (key, next_at_us) VALUES (:key, :at)",
                       [{"key": "telegram:chat:1", "at": us - 2 * 86_400_000_000},
                        {"key": "telegram:chat:2", "at": us - 3_600_000_000},
                        {"key": "telegram:bot", "at": us + 1_000_000}])

    # WHEN state-cleanup runs, two rows a batch
    result = cleanup_state(db, now=now, deadline=Deadline(60), batch_size=2)

    # THEN only the rows with nothing worth keeping and no entry left are gone
    assert (result["deletedDestinations"], result["deletedRateLimits"]) == (4, 1)
    assert _keys(db, "delivery_destinations") == {
        "telegram:2", "webhook:h.example:443", "telegram:3", "telegram:4", "telegram:6",
        "telegram:7", "telegram:9"}
    assert _keys(db, "delivery_rate_limits") == {"telegram:chat:2", "telegram:bot"}
    # AND a retention of 2 days takes the one touched 3 days ago too, and nothing else
    shorter = cleanup_state(db, now=now, deadline=Deadline(60), delivery_retention_days=2)
    assert shorter["deletedDestinations"] == 1
    assert "telegram:9" not in _keys(db, "delivery_destinations")
