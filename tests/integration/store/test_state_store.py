"""The state store contract, run on SQLite and on Postgres."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sluice.core.errors import ConstraintViolation, PermanentStoreError
from sluice.store.db import utcnow
from sluice.store.state import StateStore


def test_put_get_overwrite_delete(db) -> None:  # type: ignore[no-untyped-def]
    store = StateStore(db)
    store.put("platform:flags", {"rssQueuePipeline": True, "nested": {"b": 1, "a": [1, None]}})
    assert store.get("platform:flags") == {"rssQueuePipeline": True,
                                           "nested": {"b": 1, "a": [1, None]}}
    store.put("platform:flags", ["replaced"])
    assert store.get("platform:flags") == ["replaced"]
    assert store.delete("platform:flags") is True
    assert store.get("platform:flags") is None
    assert store.delete("platform:flags") is False


@pytest.mark.parametrize("value", ["text with 'quotes' and ünïcode", 42, 1.5, True, None])
def test_scalars_round_trip(db, value) -> None:  # type: ignore[no-untyped-def]
    store = StateStore(db)
    store.put("k", value)
    with db.transaction() as tx:
        row = tx.fetchone("SELECT value FROM platform_state WHERE key = 'k'")
    assert row is not None and row["value"] == value


def test_expired_rows_are_invisible(db) -> None:  # type: ignore[no-untyped-def]
    store = StateStore(db)
    now = utcnow()
    store.put("old", 1, expires_at=now - timedelta(seconds=1))
    store.put("fresh", 2, ttl=timedelta(hours=1))
    assert store.get("old") is None
    assert store.get("fresh") == 2
    assert store.keys_with_prefix("") == ["fresh"]


def test_prefix_listing_escapes_like_wildcards(db) -> None:  # type: ignore[no-untyped-def]
    store = StateStore(db)
    for key in ("platform:alerts-rules:t1", "platform:alerts-rules:t2", "platform:alertsXrules:t3",
                "platform:alerts_rules:t4", "platform:alerts%rules:t5"):
        store.put(key, {})
    assert store.keys_with_prefix("platform:alerts-rules:") == [
        "platform:alerts-rules:t1", "platform:alerts-rules:t2"]
    assert store.keys_with_prefix("platform:alerts_rules:") == ["platform:alerts_rules:t4"]
    assert store.keys_with_prefix("platform:alerts%") == ["platform:alerts%rules:t5"]


def test_hash_fields(db) -> None:  # type: ignore[no-untyped-def]
    store = StateStore(db)
    store.hash_put("h", "b", {"n": 2})
    store.hash_put("h", "a", 1)
    store.hash_put("h", "a", 3)
    assert store.hash_get_all("h") == {"a": 3, "b": {"n": 2}}


def test_timestamps_are_utc_aware(db) -> None:  # type: ignore[no-untyped-def]
    StateStore(db).put("k", 1)
    with db.transaction() as tx:
        row = tx.fetchone("SELECT updated_at FROM platform_state WHERE key = 'k'")
    assert row is not None and row["updated_at"].utcoffset() == timedelta(0)


def test_driver_errors_are_translated(db) -> None:  # type: ignore[no-untyped-def]
    StateStore(db).put("dup", 1)
    with pytest.raises(ConstraintViolation), db.transaction() as tx:
        tx.execute("INSERT INTO platform_state (key, value, updated_at) VALUES ('dup', :v, :now)",
                   {"v": tx.json(1), "now": utcnow()})
    with pytest.raises(PermanentStoreError), db.transaction() as tx:
        tx.execute("SELECT * FROM no_such_table")


def test_a_failed_transaction_leaves_nothing(db) -> None:  # type: ignore[no-untyped-def]
    store = StateStore(db)
    with pytest.raises(RuntimeError), db.transaction() as tx:
        tx.execute("INSERT INTO platform_state (key, value, updated_at) VALUES ('x', :v, :now)",
                   {"v": tx.json(1), "now": utcnow()})
        raise RuntimeError("boom")
    assert store.get("x") is None
