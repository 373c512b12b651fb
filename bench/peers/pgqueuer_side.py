"""PgQueuer's side (Postgres): its fastest driver (asyncpg), as its own benchmark runs it.

``Queries.install``, then ``Queries.enqueue("noop", None)`` one call at a time; then one
``PgQueuer`` a worker, each on its own connection, running ``mode=drain`` (it returns once
the queue is empty and its completion buffer flushed) at its default batch size (10).
PgQueuer completes jobs in batches: a job's completion (its row deleted, a ``successful``
log row written) is buffered and committed with others, by size or after a short timeout.
Latency: the ``successful`` log row's ``created`` less the ``queued`` one's. Batches: one
``enqueue`` of lists per batch.
"""

from __future__ import annotations

import asyncio
import time

from bench.peers.common import Measured, Spec

LATENCIES = """SELECT q.created, s.created FROM pgqueuer_log q
JOIN pgqueuer_log s ON s.job_id = q.job_id AND s.status = 'successful'
WHERE q.status = 'queued' AND q.entrypoint = 'noop'"""


async def _run(url: str, spec: Spec) -> Measured:
    import asyncpg
    from pgqueuer import AsyncpgDriver, PgQueuer, Queries
    from pgqueuer.models import Job
    from pgqueuer.types import QueueExecutionMode

    conn = await asyncpg.connect(url)
    queries = Queries(AsyncpgDriver(conn))
    await queries.install()

    started = time.perf_counter()
    for _ in range(spec.n):
        await queries.enqueue("noop", None)
    enqueue_s = time.perf_counter() - started

    workers = []
    for _ in range(spec.workers):
        pgq = PgQueuer(AsyncpgDriver(await asyncpg.connect(url)))

        @pgq.entrypoint("noop")
        async def noop(job: Job) -> None:
            return None

        workers.append(pgq)
    started = time.perf_counter()
    await asyncio.gather(*(pgq.run(mode=QueueExecutionMode.drain) for pgq in workers))
    process_s = time.perf_counter() - started

    rows = await conn.fetch(LATENCIES)
    latencies = [(done - queued).total_seconds() for queued, done in rows]

    started = time.perf_counter()
    for _ in range(0, spec.n, spec.batch):
        await queries.enqueue(["unconsumed"] * spec.batch, [None] * spec.batch, [0] * spec.batch)
    batch_s = time.perf_counter() - started
    await conn.close()
    return Measured(enqueue_s, process_s, latencies, completed=len(rows), batch_s=batch_s)


def run(store: str, target: str, spec: Spec) -> Measured:
    return asyncio.run(_run(target, spec))
