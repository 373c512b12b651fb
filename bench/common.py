"""Timing helpers shared by the benchmarks: medians of repeated runs and result rows."""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypedDict

ADMIN_URL = os.environ.get("SLUICE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


class _RowRequired(TypedDict):
    name: str
    sluice: float
    baseline: float
    unit: str
    ratio: float


class Row(_RowRequired, total=False):
    note: str


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call of ``fn`` takes (monotonic, high resolution)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_time(fn: Callable[[], Any], *, repeat: int = 5, warmup: int = 0,
                setup: Callable[[], Any] | None = None) -> float:
    """Median seconds of ``repeat`` calls of ``fn`` (``setup`` runs untimed before each)."""
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    samples = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        samples.append(timed(fn))
    return statistics.median(samples)


def median(values: list[float]) -> float:
    return statistics.median(values)


def row(name: str, sluice: float, baseline: float, unit: str, higher_is_better: bool,
        note: str | None = None) -> Row:
    """A result row; ``ratio`` is how many times better Sluice is than the baseline (>1 = better).

    For a time (lower is better) that is baseline / sluice; for a throughput
    (higher is better) sluice / baseline.
    """
    if higher_is_better:
        ratio = sluice / baseline if baseline else float("inf")
    else:
        ratio = baseline / sluice if sluice else float("inf")
    result: Row = {"name": name, "sluice": sluice, "baseline": baseline, "unit": unit,
                   "ratio": ratio}
    if note:
        result["note"] = note
    return result


@contextmanager
def scratch_sqlite(name: str) -> Iterator[tuple[Any, str]]:
    """A migrated SQLite database of the benchmark's own in a temporary directory
    (``SLUICE_BENCH_TMP`` when set): (database, its URL)."""
    import os
    import tempfile

    from sluice.store.db import open_database
    from sluice.store.migrate import migrate

    with tempfile.TemporaryDirectory(dir=os.environ.get("SLUICE_BENCH_TMP")) as tmp:
        url = f"sqlite:///{tmp}/{name}.db"
        db = open_database(url)
        migrate(db)
        try:
            yield db, url
        finally:
            db.close()


@contextmanager
def scratch_database() -> Iterator[Any]:
    """A migrated Postgres database of the benchmark's own, dropped afterwards."""
    import psycopg

    from sluice.store.db import PostgresDatabase
    from sluice.store.migrate import migrate

    name = f"sluice_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    db = PostgresDatabase(ADMIN_URL.rsplit("/", 1)[0] + "/" + name)
    try:
        migrate(db)
        yield db
    finally:
        db.close()
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
