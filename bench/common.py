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


@contextmanager
def scratch_store(dialect: str) -> Iterator[tuple[Any, str]]:
    """A migrated database of the benchmark's own and its URL: SQLite (``scratch_sqlite``)
    or Postgres (``scratch_database``); gone afterwards."""
    if dialect == "postgres":
        with scratch_database() as pg:
            yield pg, pg.conninfo
        return
    with scratch_sqlite("bench") as found:
        yield found


ADMIN_JWT_SECRET = "bench-admin-jwt-secret-0123456789abcdef"


def admin_headers() -> dict[str, str]:
    """An ``ops`` admin's bearer token, signed with ``ADMIN_JWT_SECRET``, for an hour."""
    import jwt

    now = int(time.time())
    token = jwt.encode({"sub": "bench", "roles": ["ops"], "iat": now, "exp": now + 3600},
                       ADMIN_JWT_SECRET, algorithm="HS256")
    return {"authorization": f"Bearer {token}"}


@contextmanager
def admin_client(url: str, **env: str) -> Iterator[Any]:
    """The HTTP app on the database at ``url`` (settings ``env`` besides), through one
    in-process client; an admin's requests carry ``admin_headers()``."""
    from fastapi.testclient import TestClient

    from sluice.core.observe import Reporter
    from sluice.core.services import Services
    from sluice.core.settings import Settings
    from sluice.http.app import create_app
    from sluice.store.db import open_database

    settings = Settings.from_env({"SLUICE_DATABASE_URL": url,
                                  "SLUICE_ADMIN_JWT_SECRET": ADMIN_JWT_SECRET, **env})
    services = Services(settings, open_database(url), Reporter())
    try:
        with TestClient(create_app(services)) as client:
            yield client
    finally:
        services.close()


def median_requests(client: Any, paths: tuple[str, ...], headers: dict[str, str],
                    repeat: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Median milliseconds of ``repeat`` GETs of each of ``paths`` (interleaved, after an
    untimed one each that warms the plans and caches), and each path's last JSON answer."""
    for path in paths:
        assert client.get(path, headers=headers).status_code == 200
    samples: dict[str, list[float]] = {path: [] for path in paths}
    last: dict[str, Any] = {}
    for _ in range(repeat):
        for path in paths:
            start = time.perf_counter()
            response = client.get(path, headers=headers)
            samples[path].append(time.perf_counter() - start)
            assert response.status_code == 200, response.text
            last[path] = response.json()
    return {path: median(times) * 1000 for path, times in samples.items()}, last
