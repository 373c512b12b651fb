"""Postgres: the migration lock comes first, prepared statements can be switched off,
connections carry timeouts and keepalives, and statements are bounded in time."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from sluice.core.errors import TransientStoreError
from sluice.core.services import pg_options
from sluice.core.settings import Settings
from sluice.store.db import PgOptions, PostgresDatabase, open_database
from sluice.store.deadline import bounded_by
from sluice.store.migrate import discover, migrate


@pytest.fixture
def admin(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


def _wait_for_lock_waiter(admin: psycopg.Connection[Any]) -> None:
    """Until another session waits on the migrations' advisory lock (bounded by the test's
    own timeout, not a sleep)."""
    while True:
        row = admin.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND objid = %s", [PostgresDatabase.ADVISORY_LOCK]).fetchone()
        if row and row[0]:
            return
        admin.execute("SELECT pg_sleep(0.02)")


def test_migrate_reads_what_is_pending_only_once_it_holds_the_lock(
        pg_url: str, admin: psycopg.Connection[Any]) -> None:
    admin.execute("DELETE FROM schema_migrations")  # every version looks pending now
    admin.execute("SELECT pg_advisory_lock(%s)", [PostgresDatabase.ADVISORY_LOCK])
    db = open_database(pg_url)
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(migrate(db)))
    worker.start()
    try:
        _wait_for_lock_waiter(admin)
        # Another migrator finishes meanwhile and records every version.
        for m in discover("postgres"):
            admin.execute("INSERT INTO schema_migrations VALUES (%s, %s, now()::text)",
                          [m.version, m.name])
    finally:
        admin.execute("SELECT pg_advisory_unlock(%s)", [PostgresDatabase.ADVISORY_LOCK])
        worker.join(timeout=60)
        db.close()
    assert result == [[]]


def test_prepared_statements_can_be_switched_off_for_pgbouncer(pg_url: str) -> None:
    off = Settings.from_env({"SLUICE_DATABASE_URL": pg_url,
                             "SLUICE_DATABASE_PREPARED_STATEMENTS": "false"})
    for options, expect_prepared in ((pg_options(off), False), (PgOptions(), True)):
        db = PostgresDatabase(pg_url, max_size=1, options=options)
        try:
            for _ in range(8):  # past psycopg's default threshold of 5
                with db.transaction() as tx:
                    tx.fetchone("SELECT 1 AS one WHERE :x = 1", {"x": 1})
            with db.transaction() as tx:
                row = tx.fetchone("SELECT count(*) AS n FROM pg_prepared_statements")
            assert row is not None and (row["n"] > 0) is expect_prepared
        finally:
            db.close()


def test_connections_carry_a_connect_timeout_and_keepalives(pg_url: str) -> None:
    db = PostgresDatabase(pg_url, max_size=1, options=PgOptions(connect_timeout_s=3))
    try:
        db._ensure_open()
        with db._pool.connection() as conn:
            params = conn.info.get_parameters()
        assert params["connect_timeout"] == "3"
        assert params["keepalives"] == "1"
        assert int(params["keepalives_idle"]) > 0 and int(params["keepalives_count"]) > 0
    finally:
        db.close()


def test_a_held_table_lock_ends_the_wait_at_the_time_left(
        pg_url: str, admin: psycopg.Connection[Any]) -> None:
    db = PostgresDatabase(pg_url, max_size=1)
    holder = psycopg.connect(pg_url)
    try:
        holder.execute("LOCK TABLE ai_usage_metering_outbox IN ACCESS EXCLUSIVE MODE")
        with bounded_by(lambda: 0.3), pytest.raises(TransientStoreError, match="(lock|statement) timeout"), \
                db.transaction() as tx:
            tx.fetchall("SELECT * FROM ai_usage_metering_outbox")
        # With no time left, nothing is started at all.
        with bounded_by(lambda: 0.0), pytest.raises(TransientStoreError, match="time is up"), \
                db.transaction() as tx:
            tx.fetchone("SELECT 1 AS one")
    finally:
        holder.rollback()
        holder.close()
        db.close()


def test_a_slow_statement_ends_at_the_configured_ceiling(pg_url: str) -> None:
    db = PostgresDatabase(pg_url, max_size=1, options=PgOptions(statement_timeout_s=0.2))
    try:
        with pytest.raises(TransientStoreError, match="statement timeout"), \
                db.transaction() as tx:
            tx.fetchone("SELECT pg_sleep(5)")
    finally:
        db.close()
