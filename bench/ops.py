"""The operations read model with a long history: ``/api/admin/jobs`` and ``/api/admin/queues``
at 1k, 100k and 500k ``job_runs`` rows, on SQLite and Postgres.

History is added in place between sizes (spread over the registered jobs, one run a
minute back in time, each job's latest run the newest). Every job's runs are scheduled
but one's: ``STOPPED``, whose schedule stopped and which operators run by hand
(``admin``), so the missed-run watch finds no scheduled run of it however far back it
looks, the history that made the job list grow when that look-up walked the job's runs.
Each figure is the median of ``REPEAT`` requests through one in-process client with an
admin token; the baseline is the same request at the smallest size, so a ratio of 1.0
means flat (no growth with history) and 0.5 twice as slow.
"""

from __future__ import annotations

import os
from typing import Any

from bench.common import Row, admin_client, admin_headers, median_requests, row, scratch_store
from sluice.jobs.registry import JOBS

SIZES = tuple(int(n) for n in os.environ.get("SLUICE_BENCH_OPS_SIZES",
                                               "1000,100000,500000").split(","))
REPEAT = int(os.environ.get("SLUICE_BENCH_OPS_REPEAT", "15"))
PATHS = ("/api/admin/jobs", "/api/admin/queues")
STOPPED = min(JOBS)  # names[0] of the seed: the first job in sorted order

SEED_POSTGRES = """
INSERT INTO job_runs (id, job, trigger, request_id, started_at, finished_at, duration_ms,
                      outcome, result)
SELECT 'bench-' || n, (%(jobs)s::text[])[1 + n %% %(count)s],
       CASE WHEN n %% %(count)s = 0 THEN 'admin' ELSE 'schedule' END, 'bench-' || n,
       now() - make_interval(mins => n), now() - make_interval(mins => n), 12, 'ok',
       '{"processed": 0}'::jsonb
FROM generate_series(%(start)s, %(stop)s - 1) AS n
"""

SEED_SQLITE = """
WITH RECURSIVE seq(n) AS (SELECT :start UNION ALL SELECT n + 1 FROM seq WHERE n + 1 < :stop)
INSERT INTO job_runs (id, job, trigger, request_id, started_at, finished_at, duration_ms,
                      outcome, result)
SELECT 'bench-' || n, json_extract(:jobs, '$[' || (n % :count) || ']'),
       CASE WHEN n % :count = 0 THEN 'admin' ELSE 'schedule' END,
       'bench-' || n,
       strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || n || ' minutes') || '000+00:00',
       strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || n || ' minutes') || '000+00:00',
       12, 'ok', '{"processed": 0}'
FROM seq
"""


def _seed(db: Any, start: int, stop: int) -> None:
    names = sorted(JOBS)
    if db.dialect == "postgres":
        import psycopg

        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            conn.execute(SEED_POSTGRES, {"jobs": names, "count": len(names),
                                         "start": start, "stop": stop})
            conn.execute("VACUUM (ANALYZE) job_runs")  # settled, as autovacuum leaves a table
            conn.execute("CHECKPOINT")  # the seed's writes flushed before anything is timed
    else:
        import json
        import sqlite3

        conn = sqlite3.connect(db.path, isolation_level=None)
        try:
            conn.execute("BEGIN")
            conn.execute(SEED_SQLITE, {"jobs": json.dumps(names), "count": len(names),
                                       "start": start, "stop": stop})
            conn.execute("COMMIT")
            conn.execute("ANALYZE")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # settled, as auto-checkpoints leave it
        finally:
            conn.close()


def _latencies(url: str, db: Any) -> dict[tuple[str, int], float]:
    headers = admin_headers()
    found: dict[tuple[str, int], float] = {}
    seeded = 0
    with admin_client(url) as client:
        for size in SIZES:
            _seed(db, seeded, size)
            seeded = size
            medians, _ = median_requests(client, PATHS, headers, REPEAT)
            for path in PATHS:
                found[(path, size)] = medians[path]
    return found


def _rows(backend: str, found: dict[tuple[str, int], float]) -> list[Row]:
    rows = []
    for path in PATHS:
        base = found[(path, SIZES[0])]
        for size in SIZES[1:]:
            rows.append(row(f"ops: GET {path}, {backend}, {size:,} vs {SIZES[0]:,} job_runs",
                            found[(path, size)], base, "ms", False,
                            note=f"median of {REPEAT}; {STOPPED} run by hand only; "
                                 "ratio 1.0 = flat with history"))
    return rows


def run() -> list[Row]:
    rows: list[Row] = []
    for backend, dialect in (("SQLite", "sqlite"), ("Postgres", "postgres")):
        with scratch_store(dialect) as (db, url):
            rows += _rows(backend, _latencies(url, db))
    return rows


if __name__ == "__main__":
    for result in run():
        print(result)
