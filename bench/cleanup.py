"""state-cleanup on Postgres: batched deletes versus one single DELETE, same rows, same run.

Loads SLUICE_BENCH_CLEANUP_ROWS (default 1,000,000) expired platform_state rows
(plus 10% that have not expired) into a scratch database, twice. Reports rows/s
for each and the longest time any one transaction held its row locks: the
batched drain's longest batch versus the single statement's whole duration.
"""

from __future__ import annotations

import os
import time

import psycopg

from bench.common import Row, row, scratch_database
from sluice.jobs.cleanup import DEFAULT_BATCH_SIZE, cleanup_state
from sluice.jobs.registry import Deadline
from sluice.store.db import utcnow

ROWS = int(os.environ.get("SLUICE_BENCH_CLEANUP_ROWS", "1000000"))

LOAD = """
INSERT INTO platform_state (key, value, expires_at, updated_at)
SELECT 'bench:' || g, '{"payload": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'::jsonb,
       CASE WHEN g %% 10 = 0 THEN now() + interval '1 day' ELSE now() - (g || ' seconds')::interval END,
       now()
FROM generate_series(1, %(n)s) AS g
"""


def _load(conn: psycopg.Connection[object], expired: int) -> None:
    conn.execute("TRUNCATE platform_state")
    conn.execute(LOAD, {"n": expired * 10 // 9})
    conn.execute("VACUUM ANALYZE platform_state")


def run() -> list[Row]:
    with scratch_database() as db, psycopg.connect(db.conninfo, autocommit=True) as conn:
        _load(conn, ROWS)
        counted = conn.execute(
            "SELECT count(*) FROM platform_state WHERE expires_at < now()").fetchone()
        assert counted is not None
        expired = counted[0]

        batches: list[float] = []
        started = time.perf_counter()
        result = cleanup_state(db, now=utcnow(), deadline=Deadline(3600),
                               observe=lambda n, seconds: batches.append(seconds))
        batched_s = time.perf_counter() - started
        assert result["deleted"] == expired, result

        _load(conn, ROWS)
        started = time.perf_counter()
        with conn.transaction():
            single = conn.execute("DELETE FROM platform_state "
                                  "WHERE expires_at IS NOT NULL AND expires_at < now()")
        single_s = time.perf_counter() - started
        assert single.rowcount == expired
    note = f"{expired:,} expired rows, batches of {DEFAULT_BATCH_SIZE:,} ({len(batches)} batches)"
    return [
        row("cleanup: rows/s, batched vs one DELETE", expired / batched_s, expired / single_s,
            "rows/s", higher_is_better=True, note=note),
        row("cleanup: longest lock hold", max(batches) * 1000, single_s * 1000, "ms",
            higher_is_better=False, note="one transaction's duration"),
    ]
