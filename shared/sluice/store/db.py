"""The SQL store: one ``Database`` seam, two backends (SQLite, Postgres).

Queries live in ``shared/sluice/store/sql/<concept>.sql`` under ``-- name: <query>`` headers,
optionally with a dialect suffix (``-- name: <query> @postgres``) where the two
engines need different text. Parameters are written ``:name`` and bound by the
driver; no SQL is ever assembled from input.

Timestamps are timezone-aware UTC ``datetime`` on both backends; ``jsonb``
columns take and return Python values. Driver errors are translated here into
``TransientStoreError`` / ``PermanentStoreError``.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

from sluice.core.errors import (
    ConfigurationError,
    ConstraintViolation,
    PermanentStoreError,
    StoreError,
    TransientStoreError,
)
from sluice.store.deadline import abandon_at_deadline, shutdown_fd, statement_budget_ms

# Re-exported: callers bound their store calls with it from here too.
from sluice.store.deadline import bounded_by as bounded_by  # noqa: PLC0414
from sluice.store.params import to_pyformat

Dialect = Literal["sqlite", "postgres"]
Params = Mapping[str, Any]
Row = dict[str, Any]

SQL_DIR = Path(__file__).parent / "sql"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

_NAME = re.compile(r"^--\s*name:\s*(?P<name>[\w-]+)\s*(?:@(?P<dialect>sqlite|postgres))?\s*$")


class Query(NamedTuple):
    name: str
    text: dict[str, str]  # dialect ("any", "sqlite", "postgres") -> SQL

    def for_dialect(self, dialect: Dialect) -> str:
        return self.text.get(dialect) or self.text["any"]


class Queries:
    """Named queries of one ``shared/sluice/store/sql/<concept>.sql`` file, as attributes."""

    def __init__(self, queries: dict[str, Query]) -> None:
        self._queries = queries

    def __getattr__(self, name: str) -> Query:
        try:
            return self._queries[name]
        except KeyError:
            raise AttributeError(f"no query named {name!r}") from None

    @classmethod
    def parse(cls, text: str) -> Queries:
        found: dict[str, dict[str, list[str]]] = {}
        current: list[str] | None = None
        for line in text.splitlines():
            match = _NAME.match(line.strip())
            if match:
                variants = found.setdefault(match["name"], {})
                current = variants.setdefault(match["dialect"] or "any", [])
            elif current is not None:
                current.append(line)
        queries = {}
        for name, variants in found.items():
            texts = {d: "\n".join(lines).strip().rstrip(";") for d, lines in variants.items()}
            if "any" not in texts and set(texts) != {"sqlite", "postgres"}:
                raise ConfigurationError(f"query {name} needs a generic text or both dialects")
            queries[name] = Query(name, texts)
        return cls(queries)


@cache
def load_queries(concept: str) -> Queries:
    return Queries.parse((SQL_DIR / f"{concept}.sql").read_text())


_to_pyformat = to_pyformat


def utcnow() -> datetime:
    return datetime.now(UTC)


class Tx(Protocol):
    """One open transaction."""

    dialect: Dialect

    # ``final=True`` marks the transaction's last statement: the COMMIT is sent with it
    # (on Postgres in the same round trip), and no statement may follow it. An exception
    # raised in the block after it no longer rolls the transaction back.

    def execute(self, query: Query | str, params: Params | None = None, *,
                final: bool = False) -> int: ...

    def write(self, query: Query | str, params: Params | None = None) -> None:
        """A statement whose row count is not needed: on Postgres it is sent with the next
        statement that needs an answer, or with the ``COMMIT``; an error it raises still
        ends the transaction."""
        ...

    def fetchall(self, query: Query | str, params: Params | None = None, *,
                 final: bool = False) -> list[Row]: ...

    def fetchone(self, query: Query | str, params: Params | None = None, *,
                 final: bool = False) -> Row | None: ...

    def executemany(self, query: Query | str, params: list[Params]) -> None: ...

    def json(self, value: Any) -> Any:
        """``value`` adapted for a jsonb parameter (any JSON value, scalars included)."""
        ...


class Database(Protocol):
    dialect: Dialect

    def transaction(self) -> AbstractContextManager[Tx]: ...

    def close(self) -> None: ...


def _text(query: Query | str, dialect: Dialect) -> str:
    return query.for_dialect(dialect) if isinstance(query, Query) else query


# --- SQLite -----------------------------------------------------------------

BUSY_TIMEOUT_S = 30.0

def _adapt_datetime(value: datetime) -> str:
    """``YYYY-MM-DD HH:MM:SS.ffffff+00:00``: one fixed width, so text order is time order
    (``isoformat`` is twice as fast as the equivalent ``strftime``)."""
    if value.tzinfo is None:
        raise PermanentStoreError("naive datetime passed to the store; use UTC-aware values")
    return value.astimezone(UTC).isoformat(" ", "microseconds")


def _convert_timestamp(raw: bytes) -> datetime:
    return datetime.fromisoformat(raw.decode()).astimezone(UTC)


sqlite3.register_adapter(datetime, _adapt_datetime)
sqlite3.register_adapter(dict, json.dumps)
sqlite3.register_adapter(list, json.dumps)
sqlite3.register_converter("timestamptz", _convert_timestamp)
sqlite3.register_converter("jsonb", lambda raw: json.loads(raw))


# Result codes that pass (another writer, a file not there yet), extended codes included
# (SQLITE_BUSY_SNAPSHOT, SQLITE_LOCKED_SHAREDCACHE, SQLITE_CANTOPEN_ISDIR...).
TRANSIENT_SQLITE_CODES = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_CANTOPEN", "SQLITE_IOERR")


def _translate_sqlite(exc: sqlite3.Error) -> StoreError:
    if isinstance(exc, sqlite3.IntegrityError):
        return ConstraintViolation(str(exc))
    name = getattr(exc, "sqlite_errorname", None) or ""
    if name.startswith(TRANSIENT_SQLITE_CODES) or (
            isinstance(exc, sqlite3.OperationalError) and any(
                word in str(exc).lower()
                for word in ("locked", "busy", "unable to open", "disk i/o"))):
        return TransientStoreError(f"sqlite: {exc}")
    return PermanentStoreError(f"sqlite: {exc}")


BUSY_STEP_MS = 250

# json.dumps with any option builds a new encoder every call; this one is built once.
_compact_json = json.JSONEncoder(separators=(",", ":")).encode


def _busy_step(budget_ms: int) -> int:
    """``budget_ms`` rounded down to a step (never up): consecutive transactions of a run
    then share one ``busy_timeout`` and skip the PRAGMA, a lock wait ending at most one
    step before the run's time does."""
    return budget_ms if budget_ms <= BUSY_STEP_MS else budget_ms - budget_ms % BUSY_STEP_MS


class _SqliteTx:
    dialect: Dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.begun = False
        self.committed = False

    def json(self, value: Any) -> Any:
        return _compact_json(value)

    def _begin(self, final: bool = False) -> None:
        if self.committed:
            raise PermanentStoreError("a statement after the transaction's final one")
        if not self.begun:
            self.begun = True
            if final:  # the whole transaction is this statement: autocommit runs it as one
                self.committed = True
            else:
                self._conn.execute("BEGIN IMMEDIATE")

    def _run(self, query: Query | str, params: Params | None,
             final: bool = False) -> sqlite3.Cursor:
        self._begin(final)
        return self._conn.execute(_text(query, "sqlite"), params or {})

    def _final(self, final: bool) -> None:
        if final and self._conn.in_transaction:
            self._conn.execute("COMMIT")
        self.committed = self.committed or final

    def execute(self, query: Query | str, params: Params | None = None, *,
                final: bool = False) -> int:
        count = self._run(query, params, final).rowcount
        self._final(final)
        return count

    def executemany(self, query: Query | str, params: list[Params]) -> None:
        self._begin()
        self._conn.executemany(_text(query, "sqlite"), params)

    def write(self, query: Query | str, params: Params | None = None) -> None:
        self._run(query, params)

    def fetchall(self, query: Query | str, params: Params | None = None, *,
                 final: bool = False) -> list[Row]:
        cur = self._run(query, params, final)
        names = [d[0] for d in cur.description or ()]
        rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        self._final(final)
        return rows

    def fetchone(self, query: Query | str, params: Params | None = None, *,
                 final: bool = False) -> Row | None:
        rows = self.fetchall(query, params, final=final)
        return rows[0] if rows else None


class _SqliteTransaction:
    """``SqliteDatabase.transaction()``: a borrowed connection and one ``_SqliteTx`` on it
    (``BEGIN IMMEDIATE`` at its first statement), committed when the block ends, rolled
    back when it raises; sqlite3 errors come out as ``StoreError``, and a connection whose
    transaction failed is closed rather than kept. A class rather than a generator: it
    runs for every transaction, and this costs a few microseconds less each time."""

    __slots__ = ("_conn", "_db")

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    def __enter__(self) -> _SqliteTx:
        db = self._db
        busy_ms = _busy_step(statement_budget_ms(BUSY_TIMEOUT_S))  # ends with the run's time
        try:
            conn = db._borrow()
            if db._busy.get(id(conn)) != busy_ms:  # a PRAGMA only when the bound changes
                conn.execute(f"PRAGMA busy_timeout={busy_ms}")
                db._busy[id(conn)] = busy_ms
        except sqlite3.Error as exc:
            raise _translate_sqlite(exc) from exc
        self._conn = conn
        return _SqliteTx(conn)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        conn, healthy = self._conn, False
        try:
            if exc is None:
                try:
                    if conn.in_transaction:
                        conn.execute("COMMIT")
                except sqlite3.Error as err:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise _translate_sqlite(err) from err
                healthy = True
                return
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _translate_sqlite(exc) from exc
            healthy = not conn.in_transaction
        finally:
            self._db._give_back(conn, healthy)


class SqliteDatabase:
    """The embedded default, WAL mode, with a few idle connections kept for reuse.

    A transaction borrows an idle connection (or opens one) and gives it back when it
    ends, so a connection outlives its transactions: closing the last connection of a
    WAL database checkpoints the log and deletes its files, which would cost several
    extra fsyncs per transaction. Connections are never shared by two transactions at
    once, and a forked child never uses its parent's.
    """

    dialect: Dialect = "sqlite"
    MAX_IDLE = 4

    def __init__(self, path: str) -> None:
        self.path = path
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        self._busy: dict[int, int] = {}  # id(connection) -> its busy_timeout (ms)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=30, detect_types=sqlite3.PARSE_DECLTYPES, isolation_level=None,
            check_same_thread=False,
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        # LIKE compares case-sensitively, as on Postgres.
        conn.execute("PRAGMA case_sensitive_like=ON")
        return conn

    def _borrow(self) -> sqlite3.Connection:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's connections are not ours
                self._idle, self._busy = [], {}
                self._pid = os.getpid()
            if self._idle:
                return self._idle.pop()
        conn = self._connect()
        self._busy[id(conn)] = int(BUSY_TIMEOUT_S * 1000)  # as _connect set it
        return conn

    def _give_back(self, conn: sqlite3.Connection, healthy: bool) -> None:
        if healthy and not conn.in_transaction:
            with self._lock:
                if self._pid == os.getpid() and len(self._idle) < self.MAX_IDLE:
                    self._idle.append(conn)
                    return
        self._busy.pop(id(conn), None)
        conn.close()

    def transaction(self) -> _SqliteTransaction:
        return _SqliteTransaction(self)

    def run_script(self, script: str) -> None:
        conn = self._connect()
        try:
            conn.executescript(script)
        except sqlite3.Error as exc:
            raise _translate_sqlite(exc) from exc
        finally:
            conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            mine = self._pid == os.getpid()
        for conn in idle if mine else ():
            self._busy.pop(id(conn), None)
            conn.close()


# --- Postgres ---------------------------------------------------------------


_SET_BOUNDS = ("SELECT set_config('statement_timeout', %(ms)s, true), "
               "set_config('lock_timeout', %(ms)s, true)")


class _PostgresTx:
    """One transaction on an autocommit connection in pipeline mode, begun lazily.

    Nothing is sent until a result is needed: ``BEGIN`` and the transaction's time bounds
    travel with its first statement, ``write`` and ``executemany`` (which return nothing)
    wait for the next statement or the ``COMMIT``, and ``COMMIT`` ends the last flight (or
    travels with the ``final`` statement). A transaction of one ``final`` statement bound by
    the connection's own timeouts runs as that statement alone, in autocommit. A
    transaction of one statement costs at most two round trips, one that only writes with
    ``write`` / ``executemany`` one, and one that runs nothing none. Errors surface at the
    next flight at the latest, and always inside the transaction: it rolls back whole.
    """

    dialect: Dialect = "postgres"

    def __init__(self, conn: Any, budget_ms: int | None) -> None:
        self._conn = conn
        # None: the connection's own timeouts are the transaction's bounds.
        self._budget = None if budget_ms is None else {"ms": f"{budget_ms}ms"}
        self._pipeline: Any = None  # the pipeline's context manager, once begun
        self.committed = False
        self._sync: Callable[[], None] = lambda: None

    def json(self, value: Any) -> Any:
        from psycopg.types.json import Jsonb

        return Jsonb(value)

    def _cursor(self) -> Any:
        if self.committed:
            raise PermanentStoreError("a statement after the transaction's final one")
        if self._pipeline is None:
            self._pipeline = self._conn.pipeline()
            self._sync = self._pipeline.__enter__().sync
            self._conn.execute("BEGIN")
            if self._budget is not None:
                self._conn.execute(_SET_BOUNDS, self._budget)
        return self._conn.cursor()

    def _send(self, query: Query | str, params: Params | None, final: bool) -> Any:
        if final and self._pipeline is None and self._budget is None and not self.committed:
            # The whole transaction is this statement: autocommit runs it as one.
            cur = self._conn.cursor()
            self.committed = True
            cur.execute(_to_pyformat(_text(query, "postgres")), params or {})
            return cur
        cur = self._cursor()
        cur.execute(_to_pyformat(_text(query, "postgres")), params or {})
        if final:  # the COMMIT goes in the same flight; leaving the pipeline waits for both
            self._conn.execute("COMMIT")
            self.committed = True
            pipeline, self._pipeline = self._pipeline, None
            pipeline.__exit__(None, None, None)
        return cur

    def execute(self, query: Query | str, params: Params | None = None, *,
                final: bool = False) -> int:
        cur = self._send(query, params, final)
        if not final:
            self._sync()  # the row count is this statement's result
        return int(cur.rowcount)

    def executemany(self, query: Query | str, params: list[Params]) -> None:
        self._cursor().executemany(_to_pyformat(_text(query, "postgres")), params)

    def write(self, query: Query | str, params: Params | None = None) -> None:
        self._cursor().execute(_to_pyformat(_text(query, "postgres")), params or {})

    def fetchall(self, query: Query | str, params: Params | None = None, *,
                 final: bool = False) -> list[Row]:
        return list(self._send(query, params, final).fetchall())

    def fetchone(self, query: Query | str, params: Params | None = None, *,
                 final: bool = False) -> Row | None:
        row = self._send(query, params, final).fetchone()
        return dict(row) if row is not None else None

    def commit(self) -> None:
        if self._pipeline is not None:
            self._conn.execute("COMMIT")
            pipeline, self._pipeline = self._pipeline, None
            pipeline.__exit__(None, None, None)  # sends what is queued and waits for it

    def rollback(self, exc: BaseException) -> None:
        from psycopg import pq

        if self._pipeline is not None:
            pipeline, self._pipeline = self._pipeline, None
            pipeline.__exit__(type(exc), exc, exc.__traceback__)  # errors here are ignored
        status = self._conn.info.transaction_status
        if status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR):
            self._conn.execute("ROLLBACK")


def _socket_shutdown(conn: Any) -> Callable[[], None]:
    fd = conn.pgconn.socket
    return lambda: shutdown_fd(fd)


def _translate_postgres(exc: Exception) -> StoreError:
    import psycopg
    from psycopg import errors as pgerr
    from psycopg_pool import PoolTimeout

    transient = (
        psycopg.OperationalError,
        pgerr.SerializationFailure,
        pgerr.DeadlockDetected,
        pgerr.LockNotAvailable,
        PoolTimeout,
    )
    if isinstance(exc, psycopg.IntegrityError):
        return ConstraintViolation(f"postgres: {exc}")
    if isinstance(exc, transient):
        return TransientStoreError(f"postgres: {exc}")
    return PermanentStoreError(f"postgres: {exc}")


class _PgTransaction:
    """``PostgresDatabase.transaction()``: a connection (the kept one, or the pool's) and
    one ``_PostgresTx`` on it, committed when the block ends, rolled back when it raises;
    driver errors come out as ``StoreError``. A class rather than a generator: it runs
    for every transaction, and this costs a few microseconds less each time."""

    __slots__ = ("_conn", "_db", "_taken", "_tx", "_watch", "_watching")

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    def __enter__(self) -> _PostgresTx:
        db = self._db
        budget_ms = statement_budget_ms(db.options.statement_timeout_s)
        # The connection's own timeouts are the ceiling (see _session_bounds); a lower
        # bound (inside a run) is set for this transaction alone.
        lower = (budget_ms if not db.options.prepared_statements
                 or budget_ms < db._session_ms else None)
        try:
            # Waiting for a pooled connection is bounded by the same time left.
            self._conn, self._taken = db._take(min(db._pool.timeout, budget_ms / 1000))
        except db._driver_errors as exc:
            raise _translate_postgres(exc) from exc
        # A connection that stops answering (a partition, a middlebox that keeps answering
        # keepalives) is cut at the run's deadline instead of holding the run past it.
        self._watching = abandon_at_deadline(_socket_shutdown(self._conn))
        try:
            self._watch = self._watching.__enter__()
        except BaseException:
            db._give_back(self._conn, self._taken)
            raise
        self._tx = _PostgresTx(self._conn, lower)
        return self._tx

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        db, conn, tx = self._db, self._conn, self._tx
        try:
            try:
                if exc is None:
                    try:
                        tx.commit()
                    except BaseException as failed:
                        if not conn.closed:
                            tx.rollback(failed)
                        raise
                elif not conn.closed:
                    tx.rollback(exc)
            finally:
                self._watching.__exit__()
                if self._watch.fired and not conn.closed:
                    conn.close()  # cut mid-transaction: the pool replaces it
                db._give_back(conn, self._taken)
        except db._driver_errors as err:
            raise self._translated(err) from err
        if isinstance(exc, db._driver_errors):
            raise self._translated(exc) from exc

    def _translated(self, err: Exception) -> StoreError:
        if self._watch.fired:
            return TransientStoreError("postgres: no answer by the run's deadline; "
                                       "the connection was abandoned")
        return _translate_postgres(err)


class PgOptions(NamedTuple):
    """How Postgres connections are made and bounded (``Settings`` fills these in)."""

    connect_timeout_s: int = 5
    # Ceiling of every statement and lock wait; a job run lowers it to its time left.
    statement_timeout_s: float = 30.0
    # False for PgBouncer in transaction pooling: psycopg then never prepares statements.
    prepared_statements: bool = True
    # TCP keepalives: a peer gone silent is noticed after idle + interval * count seconds.
    keepalives_idle_s: int = 5
    keepalives_interval_s: int = 2
    keepalives_count: int = 3
    # Connections the pool may open: one per thread that holds a transaction at once.
    pool_size: int = 4


class PostgresDatabase:
    """Postgres through a small psycopg 3 pool (one connection is the usual case on Lambda).

    Every transaction starts with ``SET LOCAL statement_timeout`` and ``lock_timeout``
    (the options' ceiling, or less inside ``bounded_by``), so a held lock or a slow
    statement ends in a ``TransientStoreError`` instead of outliving its caller.

    The connection a transaction ended on is kept out of the pool for the next one (a
    pool checkout and return cost as much client time as a small statement); it goes back
    through the pool, which checks, expires and replaces connections, once it has been
    idle ``IDLE_CHECK_S`` or kept ``KEEP_S``, and whenever another transaction holds the
    slot or the connection is not clean.
    """

    dialect: Dialect = "postgres"
    ADVISORY_LOCK = 727274  # migrations

    def __init__(self, conninfo: str, *, max_size: int | None = None, timeout: float = 10.0,
                 options: PgOptions | None = None) -> None:
        import psycopg
        from psycopg import pq
        from psycopg.rows import dict_row
        from psycopg.types.json import JsonbDumper
        from psycopg_pool import ConnectionPool, PoolTimeout

        self.options = options = options or PgOptions()

        def configure(conn: Any) -> None:
            conn.adapters.register_dumper(dict, JsonbDumper)
            conn.adapters.register_dumper(list, JsonbDumper)
            self._mark_used(conn)  # just connected: no check needed on first use

        self.conninfo = conninfo
        self._session_ms = max(1, int(options.statement_timeout_s * 1000))
        self._lock = threading.Lock()
        self._pool = ConnectionPool(
            conninfo,
            min_size=0,
            max_size=max_size or options.pool_size,
            timeout=timeout,
            kwargs={"row_factory": dict_row, "connect_timeout": options.connect_timeout_s,
                    "keepalives": 1, "keepalives_idle": options.keepalives_idle_s,
                    "keepalives_interval": options.keepalives_interval_s,
                    "keepalives_count": options.keepalives_count, "autocommit": True,
                    "prepare_threshold": 5 if options.prepared_statements else None,
                    **self._session_bounds(options)},
            configure=configure,
            check=self._check_if_idle,
            # No ``reset`` callback: with one, the pool hands every returned connection to
            # a worker thread, and the next transaction waits for that thread to run.
            open=False,
        )
        self._opened = False
        self._used_at: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._kept: tuple[Any, float] | None = None  # (connection, taken from the pool at)
        self._driver_errors = (psycopg.Error, PoolTimeout)
        self._idle = pq.TransactionStatus.IDLE

    @staticmethod
    def _session_bounds(options: PgOptions) -> dict[str, str]:
        """The ceiling as the connection's own timeouts, so that a transaction bound by the
        ceiling alone needs no ``SET LOCAL``. Not behind PgBouncer (no prepared statements):
        it refuses such startup options, and its server connections change between
        transactions, so there every transaction sets its bounds."""
        if not options.prepared_statements:
            return {}
        ms = max(1, int(options.statement_timeout_s * 1000))
        return {"options": f"-c statement_timeout={ms} -c lock_timeout={ms}"}

    # A connection a transaction ended on less than this long ago is used without a check;
    # one idle longer (a frozen Lambda sandbox, a restarted server) is checked first.
    IDLE_CHECK_S = 5.0
    # A kept connection returns through the pool at least this often (its lifetime limit).
    KEEP_S = 60.0

    def _mark_used(self, conn: Any) -> None:
        self._used_at[conn] = time.monotonic()

    def _check_if_idle(self, conn: Any) -> None:
        from psycopg_pool import ConnectionPool

        used = self._used_at.get(conn)
        if used is None or time.monotonic() - used > self.IDLE_CHECK_S:
            with abandon_at_deadline(_socket_shutdown(conn)):  # the check is a round trip too
                ConnectionPool.check_connection(conn)

    def _ensure_open(self) -> None:
        if not self._opened:
            with self._lock:
                if not self._opened:
                    self._pool.open(wait=False)
                    self._opened = True

    def _take(self, wait: float) -> tuple[Any, float]:
        """A connection for one transaction: the kept one if it is fresh, else the pool's."""
        with self._lock:
            kept, self._kept = self._kept, None
        if kept is not None:
            conn, taken = kept
            now = time.monotonic()
            if (now - self._used_at.get(conn, -self.IDLE_CHECK_S - 1.0) <= self.IDLE_CHECK_S
                    and now - taken <= self.KEEP_S):
                return kept
            self._pool.putconn(conn)  # the pool checks it (idle) or replaces it (expired)
        self._ensure_open()
        return self._pool.getconn(timeout=wait), time.monotonic()

    def _give_back(self, conn: Any, taken: float) -> None:
        if not conn.closed and conn.pgconn.transaction_status == self._idle:
            self._mark_used(conn)
            with self._lock:
                if self._kept is None and self._opened:
                    self._kept = (conn, taken)
                    return
        self._pool.putconn(conn)  # a broken connection is discarded and replaced there

    def transaction(self) -> _PgTransaction:
        return _PgTransaction(self)

    def run_script(self, script: str) -> None:
        import psycopg

        self._ensure_open()
        try:
            with self._pool.connection() as conn, conn.transaction():
                conn.execute(f"SELECT pg_advisory_xact_lock({self.ADVISORY_LOCK})")
                conn.execute(script)
        except psycopg.Error as exc:
            raise _translate_postgres(exc) from exc

    @contextmanager
    def migration_session(self) -> Iterator[Callable[[str], list[Row]]]:
        """One connection holding the migration lock throughout; yields ``run(sql)``, each
        call its own transaction. The lock is taken before anything is read, so two
        migrators never both see the same migration as pending."""
        import psycopg

        self._ensure_open()
        try:
            with self._pool.connection() as conn:
                conn.execute(f"SELECT pg_advisory_lock({self.ADVISORY_LOCK})")
                conn.commit()
                try:
                    def run(sql: str) -> list[Row]:
                        try:
                            with conn.transaction():
                                cur = conn.execute(sql)
                                return list(cur.fetchall()) if cur.description else []
                        except psycopg.Error as exc:
                            raise _translate_postgres(exc) from exc

                    yield run
                finally:
                    conn.execute(f"SELECT pg_advisory_unlock({self.ADVISORY_LOCK})")
                    conn.commit()
        except psycopg.Error as exc:
            raise _translate_postgres(exc) from exc

    def close(self) -> None:
        with self._lock:  # nothing is kept after this: _give_back sees the pool closed
            kept, self._kept = self._kept, None
            opened, self._opened = self._opened, False
        if kept is not None:
            self._pool.putconn(kept[0])
        if opened:
            self._pool.close()


def sqlite_path(url: str) -> Path | None:
    """The absolute path of an SQLite URL's file (None for Postgres)."""
    return Path(url.removeprefix("sqlite:///")).resolve() if url.startswith("sqlite:///") else None


def require_existing(url: str) -> None:
    """Refuse an SQLite URL whose file does not exist: only ``sluice migrate`` (and
    ``sluice dev``) create the database, so a mistyped path never becomes an empty one."""
    path = sqlite_path(url)
    if path is not None and not path.exists():
        raise ConfigurationError(
            f"SLUICE_DATABASE_URL: no SQLite database at {path}; create it with "
            "`sluice migrate` (or `sluice dev`) here, or point SLUICE_DATABASE_URL at the "
            "existing one")


def open_database(url: str, options: PgOptions | None = None,
                  ) -> SqliteDatabase | PostgresDatabase:
    if url.startswith("sqlite:"):
        # SQLAlchemy's convention: sqlite:///relative/path, sqlite:////absolute/path
        if not url.startswith("sqlite:///"):
            raise ConfigurationError("SLUICE_DATABASE_URL for SQLite must look like sqlite:///path")
        path = url.removeprefix("sqlite:///")
        if path in ("", ":memory:") or path.startswith("file::memory:"):
            raise ConfigurationError(
                "SLUICE_DATABASE_URL: an in-memory SQLite database (sqlite:///) is not supported: "
                "the store uses several connections and each would find its own empty "
                "database; give a file path, e.g. sqlite:///./.sluice/sluice.db")
        return SqliteDatabase(path)
    if url.startswith(("postgresql:", "postgres:")):
        return PostgresDatabase(url, options=options)
    raise ConfigurationError(f"SLUICE_DATABASE_URL has an unknown scheme: {url.split(':', 1)[0]}")
