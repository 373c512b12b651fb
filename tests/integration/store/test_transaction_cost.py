"""What a transaction costs: SQLite keeps its connections, Postgres its round trips few."""

from __future__ import annotations

import itertools
import multiprocessing
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import pq

from sluice.core.errors import ConstraintViolation, StoreError
from sluice.store.db import (
    PgOptions,
    PostgresDatabase,
    SqliteDatabase,
    bounded_by,
    open_database,
    utcnow,
)


def _touch_lease(db: SqliteDatabase | PostgresDatabase, job: str) -> None:
    now = utcnow()
    with db.transaction() as tx:
        tx.execute("INSERT INTO job_leases (job, holder, acquired_at, expires_at) "
                   "VALUES (:job, 'h', :now, :later)",
                   {"job": job, "now": now, "later": now + timedelta(minutes=1)})


def test_sqlite_keeps_a_connection_so_the_wal_is_not_checkpointed_away(sqlite_url: str) -> None:
    db = open_database(sqlite_url)
    assert isinstance(db, SqliteDatabase)
    try:
        _touch_lease(db, "a")
        # Closing a WAL database's last connection checkpoints and deletes the log;
        # a kept connection leaves it in place for the next transaction to append to.
        assert Path(db.path + "-wal").exists()
        _touch_lease(db, "b")
        assert len(db._idle) == 1  # one connection served both transactions
    finally:
        db.close()
    assert db._idle == []


def _child(db: SqliteDatabase) -> None:
    _touch_lease(db, "from-child")
    db.close()


def test_a_forked_child_opens_its_own_sqlite_connection(sqlite_url: str) -> None:
    db = open_database(sqlite_url)
    assert isinstance(db, SqliteDatabase)
    try:
        _touch_lease(db, "parent-before")
        [parents] = db._idle
        child = multiprocessing.get_context("fork").Process(target=_child, args=(db,))
        child.start()
        child.join(30)
        assert child.exitcode == 0
        _touch_lease(db, "parent-after")  # the parent's connection is intact
        assert db._idle == [parents]
        with db.transaction() as tx:
            jobs = {row["job"] for row in tx.fetchall("SELECT job FROM job_leases")}
        assert jobs == {"parent-before", "from-child", "parent-after"}
    finally:
        db.close()


def round_trips(db: PostgresDatabase, work: Callable[[], object]) -> tuple[int, str]:
    """Round trips ``work`` costs (flights of client messages answered by the server), and
    the protocol trace; ``db`` has one pooled connection."""
    with db.transaction() as tx:  # runs nothing: sends nothing
        conn = tx._conn  # the one connection, kept for the next transaction
    with tempfile.NamedTemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        work()
        conn.pgconn.untrace()
        text = Path(trace.name).read_text()
    senders = [line.split("\t", 1)[0] for line in text.splitlines() if line]
    flights = sum(1 for a, b in itertools.pairwise(senders) if (a, b) == ("F", "B"))
    return flights, text


def _round_trips(db: PostgresDatabase, body: str) -> tuple[int, str]:
    def work() -> None:
        with db.transaction() as tx:
            if body == "one-statement":
                tx.execute("UPDATE job_leases SET holder = holder WHERE job = :job", {"job": "x"})
            elif body == "two-statements":
                tx.fetchall("SELECT job FROM job_leases WHERE job = :job", {"job": "x"})
                tx.execute("DELETE FROM job_leases WHERE job = :job", {"job": "x"})
            elif body == "final":
                tx.execute("UPDATE job_leases SET holder = holder WHERE job = :job", {"job": "x"},
                           final=True)
            elif body == "writes-only":
                tx.executemany("DELETE FROM job_leases WHERE job = :job", [{"job": "x"}] * 3)
                tx.write("DELETE FROM job_leases WHERE job = :job", {"job": "y"})
    return round_trips(db, work)


def test_a_postgres_transaction_costs_a_round_trip_per_statement_plus_its_commit(
        pg_url: str) -> None:
    db = PostgresDatabase(pg_url, max_size=1)
    try:
        _touch_lease(db, "warm")
        one, trace = _round_trips(db, "one-statement")
        assert one == 2, trace  # BEGIN + time bounds + UPDATE in one flight; COMMIT
        assert "statement_timeout" not in trace and '"COMMIT"' in trace  # bounds: the session's
        two, trace = _round_trips(db, "two-statements")
        assert two == 3, trace
        final, trace = _round_trips(db, "final")
        assert final == 1, trace  # BEGIN, bounds, the statement and COMMIT in one flight
        writes, trace = _round_trips(db, "writes-only")
        assert writes == 1, trace  # write / executemany answer nothing: they go with the COMMIT
        nothing, trace = _round_trips(db, "nothing")
        assert nothing == 0, trace  # a transaction that runs nothing sends nothing
    finally:
        db.close()


def test_a_postgres_connection_is_kept_between_transactions_not_pooled_each_time(
        pg_url: str) -> None:
    db = PostgresDatabase(pg_url, max_size=2)
    try:
        for _ in range(5):
            with db.transaction() as tx:
                tx.execute("SELECT 1", final=True)
        # One checkout from the pool served all five (a checkout and return each, with the
        # pool's worker thread taking the return, cost more client time than a statement).
        assert db._pool.get_stats()["requests_num"] == 1
        with db.transaction() as outer, db.transaction() as inner:  # two at once: two
            assert outer._conn is not inner._conn
        assert db._pool.get_stats()["requests_num"] == 2
    finally:
        db.close()
    assert db._kept is None


def test_a_kept_connection_goes_back_through_the_pool_when_kept_too_long(pg_url: str) -> None:
    db = PostgresDatabase(pg_url, max_size=1)
    try:
        with db.transaction() as tx:
            tx.execute("SELECT 1", final=True)
        db.KEEP_S = -1.0
        with db.transaction() as tx:
            tx.execute("SELECT 1", final=True)
        assert db._pool.get_stats()["requests_num"] == 2  # returned, then taken again
    finally:
        db.close()


def test_a_postgres_connection_idle_too_long_is_checked_and_replaced(pg_url: str) -> None:
    db = PostgresDatabase(pg_url, max_size=1)
    try:
        with db.transaction() as tx:
            pid = tx.fetchone("SELECT pg_backend_pid() AS pid")
        assert pid is not None
        with psycopg.connect(pg_url, autocommit=True) as admin:  # waits until it is gone
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid["pid"],))
        # Freshly returned connections skip the check; this one has been "idle" too long.
        db.IDLE_CHECK_S = -1.0
        with db.transaction() as tx:
            again = tx.fetchone("SELECT pg_backend_pid() AS pid")
        assert again is not None and again["pid"] != pid["pid"]
    finally:
        db.close()


def test_an_error_in_a_write_still_ends_the_transaction(db: SqliteDatabase | PostgresDatabase,
                                                         ) -> None:
    _touch_lease(db, "taken")
    with pytest.raises(ConstraintViolation), db.transaction() as tx:
        tx.write("DELETE FROM job_leases WHERE job = :job", {"job": "taken"})
        now = utcnow()
        tx.write("INSERT INTO job_leases (job, holder, acquired_at, expires_at) "
                 "VALUES ('dup', 'h', :now, :now)", {"now": now})
        tx.write("INSERT INTO job_leases (job, holder, acquired_at, expires_at) "
                 "VALUES ('dup', 'h', :now, :now)", {"now": now})
    with db.transaction() as tx:  # rolled back as a whole, and the connection is usable
        jobs = [row["job"] for row in tx.fetchall("SELECT job FROM job_leases")]
    assert jobs == ["taken"]


def test_a_final_statement_commits_with_it(db: SqliteDatabase | PostgresDatabase) -> None:
    _touch_lease(db, "kept")
    with pytest.raises(ConstraintViolation), db.transaction() as tx:  # fails: rolls back
        tx.write("UPDATE job_leases SET holder = 'gone'")
        tx.execute("INSERT INTO job_leases (job, holder, acquired_at, expires_at) "
                   "SELECT job, holder, acquired_at, expires_at FROM job_leases", final=True)
    with pytest.raises(RuntimeError), db.transaction() as tx:  # committed: stays
        assert tx.fetchall("SELECT holder FROM job_leases") == [{"holder": "h"}]
        assert tx.execute("UPDATE job_leases SET holder = 'after'", final=True) == 1
        with pytest.raises(StoreError, match="after the transaction's final"):
            tx.fetchone("SELECT 1 AS one")
        raise RuntimeError("raised after the final statement")
    with db.transaction() as tx:
        assert tx.fetchall("SELECT job, holder FROM job_leases", final=True) == [
            {"job": "kept", "holder": "after"}]


def test_the_ceiling_is_the_connections_own_and_a_run_lowers_it_per_transaction(
        pg_url: str) -> None:
    for prepared in (True, False):  # False: behind PgBouncer, every transaction sets it
        db = PostgresDatabase(pg_url, max_size=1,
                              options=PgOptions(statement_timeout_s=7,
                                                prepared_statements=prepared))
        try:
            shown: list[dict[str, str]] = []

            def show(db: PostgresDatabase = db, shown: list[dict[str, str]] = shown) -> None:
                with db.transaction() as tx:
                    row = tx.fetchone("SELECT current_setting('statement_timeout') AS s, "
                                      "current_setting('lock_timeout') AS l")
                    assert row is not None
                    shown.append(row)

            show()
            _, trace = round_trips(db, show)
            assert ("set_config" in trace) is not prepared, trace
            with bounded_by(lambda: 2.0):
                _, lowered = round_trips(db, show)
            assert "set_config" in lowered
            assert shown[1] == {"s": "7s", "l": "7s"}
            assert shown[2] == {"s": "2s", "l": "2s"}
        finally:
            db.close()


def test_a_runs_postgres_transactions_leave_no_watches_behind(pg_url: str) -> None:
    # GIVEN a run with an hour left (each transaction's wait is watched)
    from sluice.store.deadline import _WATCHDOG

    db = open_database(pg_url)
    try:
        with bounded_by(lambda: 3600.0):
            # WHEN it makes 2,000 transactions
            for _ in range(2_000):
                with db.transaction() as tx:
                    tx.fetchone("SELECT 1 AS one")
            # THEN the watchdog holds a handful, not 2,000 (nothing is in flight now)
            assert _WATCHDOG.held() < _WATCHDOG.COMPACT_AT
    finally:
        db.close()
