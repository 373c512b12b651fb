"""SQLite's passing failures are transient at the store boundary: a writer holding the
file (``SQLITE_BUSY``), a table locked by the same connection (``SQLITE_LOCKED``), a file
that cannot be opened (``SQLITE_CANTOPEN``). Each is raised by the driver for real."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sluice.core.errors import PermanentStoreError, TransientStoreError
from sluice.store.db import TRANSIENT_SQLITE_CODES, _translate_sqlite


def _raised(action) -> sqlite3.Error:  # type: ignore[no-untyped-def]
    with pytest.raises(sqlite3.Error) as caught:
        action()
    return caught.value


def test_busy_locked_and_cantopen_are_transient(tmp_path: Path) -> None:
    path = tmp_path / "held.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.executemany("INSERT INTO t VALUES (?)", [(1,), (2,)])
    holder.execute("BEGIN EXCLUSIVE")
    other = sqlite3.connect(path, timeout=0)
    busy = _raised(lambda: other.execute("SELECT * FROM t"))
    holder.execute("COMMIT")
    reading = holder.execute("SELECT * FROM t")
    reading.fetchone()
    locked = _raised(lambda: holder.execute("DROP TABLE t"))
    cantopen = _raised(lambda: sqlite3.connect(tmp_path / "no" / "such" / "dir.db"))
    names = [getattr(e, "sqlite_errorname", None) for e in (busy, locked, cantopen)]
    assert names == ["SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_CANTOPEN"]
    assert set(names) <= set(TRANSIENT_SQLITE_CODES)
    for error in (busy, locked, cantopen):
        assert isinstance(_translate_sqlite(error), TransientStoreError), error
    other.close()
    holder.close()


def test_a_code_is_read_whatever_the_text_says() -> None:
    error = sqlite3.OperationalError("something unusual")
    error.sqlite_errorname = "SQLITE_BUSY_SNAPSHOT"  # type: ignore[attr-defined]
    assert isinstance(_translate_sqlite(error), TransientStoreError)
    assert isinstance(_translate_sqlite(sqlite3.OperationalError("no such table: x")),
                      PermanentStoreError)
