"""The app's request path during a Postgres outage: how long ``sluice.record_usage`` takes to
answer ``queued`` and ``sluice.enqueue_delivery`` to raise, with the bound
(``SLUICE_REQUEST_PATH_TIMEOUT_SECONDS`` = 1.5, the default) versus without it (30 s, past
every other timeout: what a call waited before the bound existed). Postgres refusing
connections (nothing listens on the port) and black-holed (a proxy that accepts and never
answers, ``tests/tcp_proxy.py``); Redis is up, so the usage entry is parked there.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import sluice
from bench.common import Row, row
from tests.tcp_proxy import StallingProxy

REDIS_URL = os.environ.get("SLUICE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PREFIX = "bench-request-path:"
SECRET = "bench-request-path-secret-0123456789"
UNBOUNDED = "30"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _seconds(call: Callable[[], Any]) -> float:
    started = time.monotonic()
    try:
        call()
    except sluice.TransientStoreError:
        pass
    return time.monotonic() - started


def _calls(url: str, bound: str) -> tuple[float, float]:
    services = sluice.connect({"SLUICE_DATABASE_URL": url, "SLUICE_REDIS_URL": REDIS_URL,
                               "SLUICE_REDIS_KEY_PREFIX": PREFIX,
                               "SLUICE_QUEUE_SIGNING_SECRET": SECRET,
                               "SLUICE_REQUEST_PATH_TIMEOUT_SECONDS": bound})
    try:
        entry = sluice.UsageEntry(id=f"bench-{time.time_ns()}", model="m", tenant_id="t",
                                  occurred_at=datetime.now(UTC), input_tokens=1)
        usage = _seconds(lambda: sluice.record_usage(services, entry))
        enqueue = _seconds(lambda: sluice.enqueue_delivery(services, "slack", "C0BENCH",
                                                           {"text": "hi"}))
        return usage, enqueue
    finally:
        services.close()


def run() -> list[Row]:
    import redis

    rows: list[Row] = []
    with StallingProxy("127.0.0.1", 5432) as proxy:
        proxy.stall()
        outages = {"refusing": f"postgresql://postgres@127.0.0.1:{_free_port()}/nowhere",
                   "black-holed": f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"}
        for outage, url in outages.items():
            bounded = _calls(url, "1.5")
            unbounded = _calls(url, UNBOUNDED)
            for n, call in enumerate(("record_usage -> queued", "enqueue_delivery -> raises")):
                rows.append(row(f"request path, postgres {outage}: {call}", bounded[n],
                                unbounded[n], "s", False, "bound 1.5 s vs none"))
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=PREFIX + "*"):
        client.delete(key)
    client.close()
    return rows
