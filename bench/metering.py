"""metering-flush on Postgres.

- DB work per row: the flush (fenced, one row a request, as a run sends it) with Polar
  stubbed to accept at once, against the same claim-and-count and mark as two
  autocommit transactions a row with plain psycopg (what a pgbench script of the two
  statements does); rounds in which the two sides take turns every few rows, median.
- batching: against the local Polar stand-in answering after 20 ms, rows/s with 100
  events per request versus 1 (the default), one request in flight either way; each
  figure one flush of 100 rows, repeated SLUICE_BENCH_METERING_RUNS times (default 3).
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta
from typing import Any

from bench.common import Row, row, scratch_database
from sluice.billing.metering import (
    IngestOutcome,
    OutboxStore,
    PolarClient,
    flush,
)
from sluice.billing.usage import UsageEntry, insert_entries
from sluice.jobs.registry import Deadline
from sluice.store.db import PostgresDatabase, utcnow

LATENCY_S = 0.020
RUNS = int(os.environ.get("SLUICE_BENCH_METERING_RUNS", "3"))
RUN_ROWS = 100  # rows one flush run sends here (its limit)


def _seed(db: PostgresDatabase, n: int, start: int) -> None:
    now = utcnow()
    insert_entries(db, [UsageEntry(id=f"bench-{i}", model="gpt-4.1-mini", occurred_at=now,
                                   tenant_id=f"t{i % 50}", input_tokens=100, output_tokens=20,
                                   cost_micros=900) for i in range(start, start + n)])


def _rows_per_second(db: PostgresDatabase, polar_url: str, token: str, per_request: int,
                     offset: int) -> float:
    from sluice.egress import Egress

    samples = []
    with Egress(timeout_s=10) as client:
        polar = PolarClient(polar_url, token, client=client)
        for run in range(RUNS):
            _seed(db, RUN_ROWS, offset + run * RUN_ROWS)
            started = time.perf_counter()
            result = flush(OutboxStore(db), polar, now=utcnow(), deadline=Deadline(600),
                           limit=RUN_ROWS, events_per_request=per_request)
            elapsed = time.perf_counter() - started
            assert result["processed"] == RUN_ROWS, result
            samples.append(RUN_ROWS / elapsed)
    return statistics.median(samples)


def run() -> list[Row]:
    return run_db_work() + run_batching()


def run_batching() -> list[Row]:
    from tests.providers.polar import PolarStandIn

    with scratch_database() as db, PolarStandIn(latency_s=LATENCY_S) as polar:
        one = _rows_per_second(db, polar.url, polar.token, 1, 0)
        hundred = _rows_per_second(db, polar.url, polar.token, 100, 1_000_000)
        assert polar.max_in_flight == 1
    return [row("metering: 100 vs 1 events/request", hundred, one, "rows/s", True,
                note=f"Polar stand-in with {LATENCY_S * 1000:.0f} ms latency, "
                     f"{RUN_ROWS} rows a run, one request in flight")]


# --- DB work per row: the flush with the provider stubbed, against two transactions a row ---

DB_ROWS = int(os.environ.get("SLUICE_BENCH_METERING_DB_ROWS", "200"))
DB_ROUNDS = int(os.environ.get("SLUICE_BENCH_METERING_DB_ROUNDS", "5"))
CHUNK = 10  # rows each side runs in turn within a round

CLAIM = """UPDATE ai_usage_metering_outbox
SET attempt_count = attempt_count + 1, status = 'failed', last_error = %s
WHERE id = (SELECT id FROM ai_usage_metering_outbox
            WHERE status = 'pending' OR (status = 'failed' AND attempt_count < %s)
            ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, ledger_id, external_customer_id, event_name, metadata, attempt_count"""
MARK = """UPDATE ai_usage_metering_outbox
SET status = 'processed', processed_at = %s, last_error = NULL WHERE id = %s"""


class _StubPolar(PolarClient):
    """Answers every request as accepted, at once: only the store's work is measured."""

    def __init__(self) -> None:
        pass

    def ingest(self, events: list[dict[str, Any]]) -> IngestOutcome:
        return IngestOutcome("ok", 202)


def _db_work_rates() -> tuple[float, float]:
    import psycopg

    from sluice.billing.usage import MAX_METERING_ATTEMPTS
    from sluice.jobs.runs import Fence, RunStore, lease_holder_id

    with scratch_database() as ours, scratch_database() as theirs:
        holder = lease_holder_id()
        assert RunStore(ours).acquire_lease("metering-flush", holder, timedelta(hours=1))
        store = OutboxStore(ours, Fence("metering-flush", holder))
        conn = psycopg.connect(theirs.conninfo, autocommit=True)
        note = "in flight: claimed by metering-flush, outcome unknown"
        sluice, plain = [], []

        def ours_chunk() -> float:
            start = time.perf_counter()
            result = flush(store, _StubPolar(), now=utcnow(), deadline=Deadline(600),
                           limit=CHUNK, events_per_request=1)
            assert result["processed"] == CHUNK, result
            return time.perf_counter() - start

        def theirs_chunk() -> float:
            start = time.perf_counter()
            for _ in range(CHUNK):
                row_ = conn.execute(CLAIM, (note, MAX_METERING_ATTEMPTS), prepare=True).fetchone()
                assert row_ is not None
                conn.execute(MARK, (utcnow(), row_[0]), prepare=True)
            return time.perf_counter() - start

        try:
            for n in range(DB_ROUNDS + 1):  # the first round warms up
                _seed(ours, DB_ROWS, n * DB_ROWS)
                _seed(theirs, DB_ROWS, n * DB_ROWS)
                ours_s = theirs_s = 0.0
                # Short alternating chunks (in turn first), so both sides meet the same
                # disk: a commit's fsync dominates either, and other load makes it vary.
                for chunk in range(DB_ROWS // CHUNK):
                    if chunk % 2:
                        theirs_s += theirs_chunk()
                        ours_s += ours_chunk()
                    else:
                        ours_s += ours_chunk()
                        theirs_s += theirs_chunk()
                if n:
                    sluice.append(DB_ROWS / ours_s)
                    plain.append(DB_ROWS / theirs_s)
        finally:
            conn.close()
    return statistics.median(sluice), statistics.median(plain)


def run_db_work() -> list[Row]:
    ours, theirs = _db_work_rates()
    return [row("metering: DB work per row, Postgres vs two transactions a row (psycopg)",
                ours, theirs, "rows/s", True,
                note=f"Polar stubbed, one row a request, fenced as in a run; Sluice: claim "
                     f"(fence + select + count) and mark (fence + mark) of the row before as "
                     f"one statement: 1 statement, 1 commit and 1 round trip a row (plus "
                     f"the first claim and the last mark of each {CHUNK}-row flush); "
                     f"reference: claim-and-count UPDATE…RETURNING + mark "
                     f"UPDATE, autocommit, prepared, 2 round trips; median of {DB_ROUNDS} "
                     f"rounds of {DB_ROWS} rows, the two sides alternating every {CHUNK}")]
