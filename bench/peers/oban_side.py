"""Oban for Python's side (Postgres; the ``oban`` package needs Python 3.12 or newer).

``oban.schema.install``, then ``Noop.enqueue({})`` one call at a time through an Oban
instance that is not yet started; then ``start()`` with the queue's limit set to the
workers, until every job is ``completed``. Oban acknowledges the jobs a producer finished
since its last fetch together, one transaction for them all. Latency: ``completed_at``
less ``inserted_at``. Batches: ``enqueue_many``.
"""

from __future__ import annotations

import asyncio
import time

from bench.peers.common import POLL_S, Measured, Spec

LATENCIES = ("SELECT inserted_at, completed_at FROM oban_jobs "
             "WHERE queue = 'bench' AND state = 'completed'")


async def _run(url: str, spec: Spec) -> Measured:
    from oban import Oban, worker
    from oban.schema import install

    @worker(queue="bench")
    class Noop:
        async def process(self, job: object) -> None:
            return None

    @worker(queue="unconsumed")
    class Unconsumed:
        async def process(self, job: object) -> None:
            return None

    pool = await Oban.create_pool(url)
    await install(pool)
    oban = Oban(pool=pool, queues={"bench": spec.workers})

    started = time.perf_counter()
    for _ in range(spec.n):
        await Noop.enqueue({})
    enqueue_s = time.perf_counter() - started

    async def completed() -> int:
        async with pool.connection() as conn:
            cursor = await conn.execute("SELECT count(*) FROM oban_jobs "
                                        "WHERE queue = 'bench' AND state = 'completed'")
            row = await cursor.fetchone()
        assert row is not None
        return int(row[0])

    ends = time.monotonic() + spec.timeout_s
    started = time.perf_counter()
    await oban.start()
    while await completed() < spec.n:
        if time.monotonic() > ends:
            raise TimeoutError(f"oban: not done after {spec.timeout_s:.0f} s")
        await asyncio.sleep(POLL_S)
    process_s = time.perf_counter() - started
    await oban.stop()

    async with pool.connection() as conn:
        rows = await (await conn.execute(LATENCIES)).fetchall()
    latencies = [(done - inserted).total_seconds() for inserted, done in rows]

    started = time.perf_counter()
    for _ in range(0, spec.n, spec.batch):
        await oban.enqueue_many([Unconsumed.new({}) for _ in range(spec.batch)])
    batch_s = time.perf_counter() - started
    await pool.close()
    return Measured(enqueue_s, process_s, latencies, completed=len(rows), batch_s=batch_s)


def run(store: str, target: str, spec: Spec) -> Measured:
    return asyncio.run(_run(target, spec))
