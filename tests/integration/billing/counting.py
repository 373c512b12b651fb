"""A store that records the statements it is asked to run (to count round trips)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sluice.store.db import Database, Query


class _CountingTx:
    def __init__(self, tx: Any, seen: list[str]) -> None:
        self._tx = tx
        self._seen = seen
        self.dialect = tx.dialect

    def json(self, value: Any) -> Any:
        return self._tx.json(value)

    def __getattr__(self, method: str) -> Any:
        call = getattr(self._tx, method)

        def counted(query: Query | str, *args: Any, **kwargs: Any) -> Any:
            self._seen.append(query.name if isinstance(query, Query) else query)
            return call(query, *args, **kwargs)

        return counted


class CountingDatabase:
    """The real store, recording the name of every statement it is asked to run."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.dialect = db.dialect
        self.statements: list[str] = []
        self.transactions: list[list[str]] = []  # the statements of each transaction

    @contextmanager
    def transaction(self) -> Iterator[_CountingTx]:
        with self.db.transaction() as tx:
            counted = _CountingTx(tx, [])
            yield counted
        self.statements.extend(counted._seen)
        self.transactions.append(counted._seen)

    def close(self) -> None:
        self.db.close()
