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
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jwt

from bench.common import Row, median, row, scratch_database
from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.jobs.registry import JOBS
from sluice.store.db import open_database
from sluice.store.migrate import migrate

SIZES = tuple(int(n) for n in os.environ.get("SLUICE_BENCH_OPS_SIZES",
                                               "1000,100000,500000").split(","))
REPEAT = int(os.environ.get("SLUICE_BENCH_OPS_REPEAT", "15"))
JWT_SECRET = "bench-admin-jwt-secret-0123456789abcdef"
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


@contextmanager
def _client(url: str) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from sluice.http.app import create_app

    settings = Settings.from_env({"SLUICE_DATABASE_URL": url,
                                  "SLUICE_ADMIN_JWT_SECRET": JWT_SECRET})
    services = Services(settings, open_database(url), Reporter())
    try:
        with TestClient(create_app(services)) as client:
            yield client
    finally:
        services.close()


def _latencies(url: str, db: Any) -> dict[tuple[str, int], float]:
    now = int(time.time())
    token = jwt.encode({"sub": "bench", "roles": ["ops"], "iat": now, "exp": now + 3600},
                       JWT_SECRET, algorithm="HS256")
    headers = {"authorization": f"Bearer {token}"}
    found: dict[tuple[str, int], float] = {}
    seeded = 0
    with _client(url) as client:
        for size in SIZES:
            _seed(db, seeded, size)
            seeded = size
            for path in PATHS:
                assert client.get(path, headers=headers).status_code == 200
            samples: dict[str, list[float]] = {path: [] for path in PATHS}
            for _ in range(REPEAT):
                for path in PATHS:
                    start = time.perf_counter()
                    response = client.get(path, headers=headers)
                    samples[path].append(time.perf_counter() - start)
                    assert response.status_code == 200, response.text
            for path in PATHS:
                found[(path, size)] = median(samples[path]) * 1000
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
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        db = open_database(url)
        migrate(db)
        rows += _rows("SQLite", _latencies(url, db))
        db.close()
    with scratch_database() as pg:
        rows += _rows("Postgres", _latencies(pg.conninfo, pg))
    return rows


if __name__ == "__main__":
    for result in run():
        print(result)
