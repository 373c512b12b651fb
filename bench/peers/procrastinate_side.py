"""Procrastinate's side (Postgres, psycopg 3 async connector).

``apply_schema_async``, then ``noop.defer_async()`` one call at a time; then one worker
with ``concurrency`` set to the workers and ``wait=False`` (it returns once no job is
left). Each job is fetched by one statement and finished by another, each its own
commit. Latency: the job's ``succeeded`` event less its ``deferred`` one
(``procrastinate_events``, written by its own triggers). Batches: ``batch_defer_async``.
"""

from __future__ import annotations

import asyncio
import time

from bench.peers.common import Measured, Spec, pg_rows

LATENCIES = """SELECT d.at, s.at FROM procrastinate_events d
JOIN procrastinate_events s ON s.job_id = d.job_id AND s.type = 'succeeded'
JOIN procrastinate_jobs j ON j.id = d.job_id AND j.queue_name = 'bench'
WHERE d.type = 'deferred'"""


async def _run(url: str, spec: Spec) -> Measured:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop", queue="bench")
    async def noop() -> None:
        return None

    @app.task(name="unconsumed", queue="unconsumed")
    async def unconsumed() -> None:
        return None

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        started = time.perf_counter()
        for _ in range(spec.n):
            await noop.defer_async()
        enqueue_s = time.perf_counter() - started

        started = time.perf_counter()
        await app.run_worker_async(queues=["bench"], concurrency=spec.workers, wait=False,
                                   install_signal_handlers=False)
        process_s = time.perf_counter() - started

        started = time.perf_counter()
        for _ in range(0, spec.n, spec.batch):
            await unconsumed.batch_defer_async(*[{}] * spec.batch)
        batch_s = time.perf_counter() - started

    rows = pg_rows(url, LATENCIES)
    latencies = [(done - deferred).total_seconds() for deferred, done in rows]
    return Measured(enqueue_s, process_s, latencies, completed=len(rows), batch_s=batch_s)


def run(store: str, target: str, spec: Spec) -> Measured:
    return asyncio.run(_run(target, spec))
