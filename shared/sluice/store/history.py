"""Operations history: small, timestamped samples (queue depths, job runs) kept for charts."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple

from sluice.store.db import Database, Tx, load_queries

Q = load_queries("history")

Kind = Literal["depth", "job"]
# Samples older than this are pruned by state-cleanup (the longest chart is 7 days).
RETENTION = timedelta(days=8)


class Sample(NamedTuple):
    kind: Kind
    name: str
    at: datetime
    value: float | None
    outcome: str | None = None


def add_samples(tx: Tx, samples: Iterable[Sample]) -> None:
    """Add ``samples`` inside the caller's transaction."""
    rows: list[Mapping[str, Any]] = [{"id": str(uuid.uuid4()), "kind": s.kind, "name": s.name, "at": s.at,
             "value": s.value, "outcome": s.outcome} for s in samples]
    if rows:
        tx.executemany(Q.add_sample, rows)


class HistoryStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, samples: Iterable[Sample]) -> int:
        samples = list(samples)
        if samples:
            with self.db.transaction() as tx:
                add_samples(tx, samples)
        return len(samples)

    def latest_at(self, kind: Kind) -> datetime | None:
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.latest_at, {"kind": kind})
        at = row["at"] if row else None
        if isinstance(at, str):  # SQLite does not type aggregates
            at = datetime.fromisoformat(at)
        return at

    def series(self, kind: Kind, since: datetime) -> dict[str, list[Sample]]:
        """Every sample of ``kind`` since ``since``, per name, oldest first."""
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.series, {"kind": kind, "since": since})
        out: dict[str, list[Sample]] = {}
        for row in rows:
            value = row["value"]
            out.setdefault(row["name"], []).append(Sample(
                kind, row["name"], row["at"], None if value is None else float(value),
                row["outcome"]))
        return out
