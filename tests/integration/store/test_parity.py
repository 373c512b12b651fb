"""The two backends agree: LIKE, parameters next to comments, literals and casts."""

from __future__ import annotations

import pytest

from sluice.store.db import Database
from sluice.store.state import StateStore


def test_like_is_case_sensitive_on_both_backends(db: Database) -> None:
    with db.transaction() as tx:
        row = tx.fetchone("SELECT CASE WHEN 'Abc' LIKE 'a%' THEN 1 ELSE 0 END AS hit, "
                          "CASE WHEN 'Abc' LIKE 'A%' THEN 1 ELSE 0 END AS exact")
    assert row == {"hit": 0, "exact": 1}


def test_state_prefix_listing_agrees(db: Database) -> None:
    state = StateStore(db)
    state.put("Feed:one", {"v": 1})
    state.put("feed:two", {"v": 2})
    assert sorted(state.keys_with_prefix("feed:")) == ["feed:two"]


@pytest.mark.parametrize("sql", [
    "SELECT :a AS a, :b AS b -- the user's comment: :c\n",
    "SELECT /* don't */ :a AS a, :b AS b",
    "SELECT :a AS a, :b AS b, 'it''s :c' AS s",
    "SELECT CAST(:a AS text) AS a, CAST(:b AS text) AS b",
])
def test_parameters_bind_next_to_comments_literals_and_casts(db: Database, sql: str) -> None:
    with db.transaction() as tx:
        row = tx.fetchone(sql, {"a": "x", "b": "y"})
    assert row is not None and (str(row["a"]), str(row["b"])) == ("x", "y")


def test_a_cast_after_a_parameter_binds_on_postgres(pg_url: str) -> None:
    from sluice.store.db import open_database

    db = open_database(pg_url)
    try:
        with db.transaction() as tx:
            row = tx.fetchone("SELECT :a::text AS a, '{}'::jsonb AS j -- it's :b\n", {"a": "x"})
        assert row == {"a": "x", "j": {}}
    finally:
        db.close()


def test_a_sqlite_lock_wait_ends_at_the_time_left(sqlite_url: str) -> None:
    import sqlite3

    from sluice.core.errors import TransientStoreError
    from sluice.store.db import open_database
    from sluice.store.deadline import bounded_by

    db = open_database(sqlite_url)
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with bounded_by(lambda: 0.2), pytest.raises(TransientStoreError, match="locked"), \
                db.transaction() as tx:
            tx.execute("DELETE FROM platform_state")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
