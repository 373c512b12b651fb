"""The platform_state key-value store (and its hash companion) over ``Database``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sluice.store.db import Database, load_queries, utcnow

Q = load_queries("state")


def like_escape(text: str) -> str:
    """``text`` as a literal inside a LIKE pattern (with ``\\`` as escape)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def like_prefix(prefix: str) -> str:
    """A LIKE pattern matching keys that start with ``prefix`` (with ``\\`` as escape)."""
    return like_escape(prefix) + "%"


class StateStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, key: str, *, now: datetime | None = None) -> Any | None:
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.get, {"key": key, "now": now or utcnow()})
        return row["value"] if row else None

    def put(self, key: str, value: Any, *, ttl: timedelta | None = None,
            expires_at: datetime | None = None, now: datetime | None = None) -> None:
        now = now or utcnow()
        if ttl is not None:
            expires_at = now + ttl
        with self.db.transaction() as tx:
            tx.execute(Q.put, {"key": key, "value": tx.json(value), "expires_at": expires_at,
                               "now": now})

    def delete(self, key: str) -> bool:
        with self.db.transaction() as tx:
            return tx.execute(Q.delete, {"key": key}) > 0

    def keys_with_prefix(self, prefix: str, *, now: datetime | None = None) -> list[str]:
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.list_keys_by_prefix,
                               {"pattern": like_prefix(prefix), "now": now or utcnow()})
        return [row["key"] for row in rows]

    def hash_put(self, key: str, field: str, value: Any, *, now: datetime | None = None) -> None:
        with self.db.transaction() as tx:
            tx.execute(Q.hash_put, {"key": key, "field": field, "value": tx.json(value),
                                    "now": now or utcnow()})

    def hash_get_all(self, key: str) -> dict[str, Any]:
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.hash_get_all, {"key": key})
        return {row["field"]: row["value"] for row in rows}

