"""metering-flush against the local Polar stand-in answering after 20 ms: rows/s with
100 events per request versus 1 (the default), one request in flight either way.

Each figure is one run of the flush over its per-run limit (100 rows), on Postgres,
repeated SLUICE_BENCH_METERING_RUNS times (default 3) and the median taken.
"""

from __future__ import annotations

import os
import statistics
import time

from bench.common import Row, row, scratch_database
from shared.billing.metering import DEFAULT_FLUSH_LIMIT, OutboxStore, PolarClient, flush
from shared.billing.usage import UsageEntry, insert_entries
from shared.jobs.registry import Deadline
from shared.store.db import PostgresDatabase, utcnow

LATENCY_S = 0.020
RUNS = int(os.environ.get("SLUICE_BENCH_METERING_RUNS", "3"))


def _seed(db: PostgresDatabase, n: int, start: int) -> None:
    now = utcnow()
    insert_entries(db, [UsageEntry(id=f"bench-{i}", model="gpt-4.1-mini", occurred_at=now,
                                   tenant_id=f"t{i % 50}", input_tokens=100, output_tokens=20,
                                   cost_micros=900) for i in range(start, start + n)])


def _rows_per_second(db: PostgresDatabase, polar_url: str, token: str, per_request: int,
                     offset: int) -> float:
    import httpx

    samples = []
    with httpx.Client(timeout=10) as client:
        polar = PolarClient(polar_url, token, client=client)
        for run in range(RUNS):
            _seed(db, DEFAULT_FLUSH_LIMIT, offset + run * DEFAULT_FLUSH_LIMIT)
            started = time.perf_counter()
            result = flush(OutboxStore(db), polar, now=utcnow(), deadline=Deadline(600),
                           events_per_request=per_request)
            elapsed = time.perf_counter() - started
            assert result["processed"] == DEFAULT_FLUSH_LIMIT, result
            samples.append(DEFAULT_FLUSH_LIMIT / elapsed)
    return statistics.median(samples)


def run() -> list[Row]:
    from tests.providers.polar import PolarStandIn

    with scratch_database() as db, PolarStandIn(latency_s=LATENCY_S) as polar:
        one = _rows_per_second(db, polar.url, polar.token, 1, 0)
        hundred = _rows_per_second(db, polar.url, polar.token, 100, 1_000_000)
        assert polar.max_in_flight == 1
    return [row("metering: 100 vs 1 events/request", hundred, one, "rows/s", True,
                note=f"Polar stand-in with {LATENCY_S * 1000:.0f} ms latency, "
                     f"{DEFAULT_FLUSH_LIMIT} rows a run, one request in flight")]
