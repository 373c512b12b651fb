"""What every side of ``python -m bench peers`` shares: its result, its database, its clock.

A side's ``run(store, target, spec)`` enqueues ``spec.n`` no-op jobs one call at a time
(as a request handler would), then starts ``spec.workers`` workers and returns once all
``spec.n`` are committed done, checked by counting them in the side's own tables; then,
where its API has one, it times ``spec.n`` more enqueued in batches of ``spec.batch`` (into
a queue nothing consumes, after the drain, so they cost the drain nothing).
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from bench.common import ADMIN_URL

POLL_S = 0.02  # how often a side looks for its last completions
STORES = ("postgres", "sqlite")


class Spec(NamedTuple):
    n: int
    workers: int
    batch: int
    timeout_s: float  # a side still short of n done by then fails the run


class Measured(NamedTuple):
    """One side's figures: seconds for each phase, and each job's enqueue-to-completion."""

    enqueue_s: float  # n jobs enqueued one call at a time
    process_s: float  # the workers' start to the last of the n committed done
    latencies_s: Sequence[float]  # per job: stored (enqueue committed) to committed done
    completed: int  # the jobs counted done in the side's own tables afterwards
    batch_s: float | None = None  # n more enqueued in batches (None: no batch API)
    note: str = ""

    def summary(self, n: int) -> dict[str, Any]:
        ordered = sorted(self.latencies_s)
        return {"enqueuePerS": n / self.enqueue_s, "processedPerS": n / self.process_s,
                "p50Ms": 1000 * percentile(ordered, 0.50),
                "p99Ms": 1000 * percentile(ordered, 0.99),
                "batchPerS": None if self.batch_s is None else n / self.batch_s,
                "completed": self.completed, "latencies": len(ordered), "note": self.note}


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values (nearest rank; NaN for none)."""
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def wait_for(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``done`` until it holds; a side that never gets there fails the run."""
    ends = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > ends:
            raise TimeoutError(f"{what}: not done after {timeout_s:.0f} s")
        time.sleep(POLL_S)


def seconds_between(pairs: Sequence[tuple[Any, Any]]) -> list[float]:
    """``end - start`` in seconds for each (start, end) pair of datetimes or floats."""
    out = []
    for start, end in pairs:
        delta = end - start
        out.append(delta if isinstance(delta, float) else delta.total_seconds())
    return out


def pg_url(name: str) -> str:
    return ADMIN_URL.rsplit("/", 1)[0] + "/" + name


@contextmanager
def fresh_postgres(side: str) -> Iterator[str]:
    """A new, empty Postgres database for one side's run, dropped afterwards: its URL."""
    import psycopg

    name = f"bench_peers_{side.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg_url(name)
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_scalar(url: str, sql: str, params: Sequence[Any] = ()) -> Any:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def pg_rows(url: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return list(conn.execute(sql, params).fetchall())


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
