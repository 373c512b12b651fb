"""The job runner's overhead: a no-op job's cron ``GET`` against a bare FastAPI route.

Both routes live in the same FastAPI app, are called by one in-process client
(Starlette's ``TestClient``), and commit twice per request:

- Sluice: ``GET <job route>`` with the cron bearer: the constant-time check, ``run_job``
  (lease + run record in one transaction, the no-op drain, finish + release + history
  sample in another), logging and the metric;
- bare: a sync route that inserts a ``job_runs`` row and updates it, each statement its own
  commit, with the plain driver on one kept connection (``sqlite3`` with Sluice's PRAGMAs,
  autocommit psycopg with prepared statements).

The figure is requests/s, the median of interleaved rounds, on SQLite and on Postgres.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.common import Row, median, row, scratch_database
from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.jobs.registry import Job, JobContext
from sluice.store.db import open_database, utcnow
from sluice.store.migrate import migrate

ROUNDS = int(os.environ.get("SLUICE_BENCH_RUNNER_ROUNDS", "5"))
PER_ROUND = int(os.environ.get("SLUICE_BENCH_RUNNER_REQUESTS", "60"))
CRON_SECRET = "bench-cron-secret-0123456789"
NOOP = Job(name="bench-noop", route="/api/admin/bench/noop", schedule="rate(1 minute)",
           surface="state", target="bench.runner:noop")

START = ("INSERT INTO job_runs (id, job, trigger, request_id, started_at, outcome) "
         "VALUES ({p}, 'bare', 'cron_http', {p}, {p}, 'running')")
FINISH = ("UPDATE job_runs SET finished_at = {p}, duration_ms = 0, outcome = 'ok', "
          "result = '{{}}' WHERE id = {p}")


def noop(ctx: JobContext) -> dict[str, Any]:
    return {"processed": 0}


def _bare_commits(url: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """Two commits with the plain driver on one kept connection."""
    if url.startswith("sqlite"):
        conn: Any = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None,
                                    check_same_thread=False)
        for pragma in ("journal_mode=WAL", "foreign_keys=ON", "busy_timeout=30000",
                       "case_sensitive_like=ON"):
            conn.execute(f"PRAGMA {pragma}")
        p, prepare = "?", {}
    else:
        import psycopg

        conn = psycopg.connect(url, autocommit=True)
        p, prepare = "%s", {"prepare": True}
    start, finish = START.format(p=p), FINISH.format(p=p)

    def work() -> None:
        run_id = str(uuid.uuid4())
        conn.execute(start, (run_id, run_id, utcnow()), **prepare)
        conn.execute(finish, (utcnow(), run_id), **prepare)
    return work, conn.close


@contextmanager
def _client(url: str) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from sluice.http.app import _job_routes, create_app

    settings = Settings.from_env({"SLUICE_DATABASE_URL": url, "CRON_SECRET": CRON_SECRET})
    services = Services(settings, open_database(url), Reporter())
    app = create_app(services)
    app.include_router(_job_routes(NOOP))
    work, close = _bare_commits(url)

    @app.get("/bench/bare")
    def bare() -> dict[str, Any]:
        work()
        return {"processed": 0}

    try:
        with TestClient(app) as client:
            yield client
    finally:
        close()
        services.close()


def _rates(url: str) -> tuple[float, float]:
    headers = {"authorization": f"Bearer {CRON_SECRET}"}
    with _client(url) as client:
        def sluice() -> None:
            response = client.get(NOOP.route, headers=headers)
            assert response.status_code == 200, response.text

        def bare() -> None:
            assert client.get("/bench/bare").status_code == 200

        for _ in range(5):
            sluice()
            bare()
        ours, theirs = [], []
        for _ in range(ROUNDS):
            for side, samples in ((sluice, ours), (bare, theirs)):
                start = time.perf_counter()
                for _ in range(PER_ROUND):
                    side()
                samples.append(PER_ROUND / (time.perf_counter() - start))
    return median(ours), median(theirs)


def run() -> list[Row]:
    rows: list[Row] = []
    note = (f"req/s, one in-process client, median of {ROUNDS} interleaved rounds of "
            f"{PER_ROUND}; both commit twice")
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        migrate(open_database(url))
        ours, theirs = _rates(url)
    rows.append(row("runner: no-op cron GET, SQLite vs bare FastAPI route + 2 commits",
                    ours, theirs, "req/s", True, note=note))
    with scratch_database() as pg:
        ours, theirs = _rates(pg.conninfo)
    rows.append(row("runner: no-op cron GET, Postgres vs bare FastAPI route + 2 commits",
                    ours, theirs, "req/s", True, note=note))
    return rows


if __name__ == "__main__":
    for result in run():
        print(result)
