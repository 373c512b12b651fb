"""Sluice's side: the durable delivery queue through its public API.

An app's channel whose send returns at once (``bench.peers.channel``, named by
``SLUICE_APP`` as an app names its extension), entries stored by
``sluice.enqueue_delivery`` one call at a time, then the ``delivery-drain`` job run as the
command line runs it (``run_job``, trigger ``cli``: its lease, its run record, its
deadline) with ``SLUICE_DELIVERY_DRAIN_CONCURRENCY`` set to the workers, again while
anything is left (a run stops at its budget, 45 s). Each entry is acked when its send
returned and the ack committed; its latency is ``acked_at - enqueued_at`` as stored.
Then N more in batches by ``sluice.enqueue_deliveries`` (one commit a batch).
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from typing import Any

from bench.peers.common import Measured, Spec

ACKED = ("SELECT enqueued_at, acked_at FROM delivery_queue "
         "WHERE channel = 'bench-noop' AND status = 'acked'")


def _as_datetime(value: Any) -> datetime:
    if isinstance(value, str):  # SQLite hands back stored text where it has no declared type
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def run(store: str, target: str, spec: Spec) -> Measured:
    url = target if store == "postgres" else f"sqlite:///{target}/sluice.db"
    os.environ["SLUICE_APP"] = "bench.peers.channel"  # read once, at the first table lookup
    import sluice
    from sluice.delivery.store import DeliveryStore
    from sluice.jobs.registry import get_job
    from sluice.jobs.runner import run_job
    from sluice.store.db import open_database
    from sluice.store.migrate import migrate

    db = open_database(url)
    migrate(db)
    db.close()
    services = sluice.connect({"SLUICE_DATABASE_URL": url, "SLUICE_APP": "bench.peers.channel",
                               "SLUICE_DELIVERY_DRAIN_CONCURRENCY": str(spec.workers)})
    try:
        started = time.perf_counter()
        for i in range(spec.n):
            sluice.enqueue_delivery(services, "bench-noop", "bench", {"text": f"job {i}"})
        enqueue_s = time.perf_counter() - started

        job, queue = get_job("delivery-drain"), DeliveryStore(services.db)
        ends = time.monotonic() + spec.timeout_s
        started = time.perf_counter()
        runs = 0
        while True:
            outcome = run_job(job, services, "cli")
            runs += 1
            assert outcome.status == 200, outcome.body
            depth = queue.queue_status()["depth"]
            if depth["pending"] == 0 and depth["in_flight"] == 0:
                break
            if time.monotonic() > ends:
                raise TimeoutError(f"sluice: {depth} after {spec.timeout_s:.0f} s")
        process_s = time.perf_counter() - started

        with services.db.transaction() as tx:
            rows = tx.fetchall(ACKED)
        latencies = [(_as_datetime(r["acked_at"]) - _as_datetime(r["enqueued_at"])).total_seconds()
                     for r in rows]

        started = time.perf_counter()  # n more, a batch a commit, that no drain runs for
        for first in range(0, spec.n, spec.batch):
            sluice.enqueue_deliveries(services, [
                {"channel": "bench-noop", "recipient": "unconsumed", "payload": {"text": f"b {i}"}}
                for i in range(first, min(spec.n, first + spec.batch))])
        batch_s = time.perf_counter() - started
        return Measured(enqueue_s, process_s, latencies, completed=len(rows), batch_s=batch_s,
                        note=f"{runs} delivery-drain run(s); batches by sluice.enqueue_deliveries")
    finally:
        services.close()
