"""Migrations: idempotent, and the SQLite and Postgres schemas never drift."""

from __future__ import annotations

from sluice.store.db import open_database
from sluice.store.migrate import applied, discover, migrate, pending


def _columns(db) -> dict[str, set[str]]:  # type: ignore[no-untyped-def]
    with db.transaction() as tx:
        if db.dialect == "postgres":
            rows = tx.fetchall(
                "SELECT table_name AS t, column_name AS c FROM information_schema.columns "
                "WHERE table_schema = 'public'")
        else:
            tables = [r["name"] for r in tx.fetchall(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
            rows = [{"t": t, "c": col["name"]} for t in tables
                    for col in tx.fetchall("SELECT name FROM pragma_table_info(:t)", {"t": t})]
    found: dict[str, set[str]] = {}
    for row in rows:
        found.setdefault(row["t"], set()).add(row["c"])
    return found


def test_both_backends_have_the_same_tables_and_columns(sqlite_url: str, pg_url: str) -> None:
    lite, pg = open_database(sqlite_url), open_database(pg_url)
    try:
        assert _columns(lite) == _columns(pg)
        assert {"platform_state", "platform_state_hash", "job_runs", "job_leases",
                "admin_audit"} <= set(_columns(lite))
    finally:
        pg.close()


def test_migrate_is_idempotent(db) -> None:  # type: ignore[no-untyped-def]
    assert pending(db) == []
    assert migrate(db) == []
    assert applied(db) == {m.version for m in discover(db.dialect)}
