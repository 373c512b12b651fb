"""Huey's side (SQLite: ``SqliteHuey``, WAL, SQLite's default ``synchronous``).

A ``@huey.task()`` no-op called one at a time (each call one committed INSERT); then
the consumer started in process with the workers as threads, until each task has run.
Huey's dequeue deletes the task in one commit before it runs it (at most once: a crash
while it runs loses it) and stores no result for a task that returns None, so a task is
done when it returned. Latency: the call's return to the task's return (this process's
clock). Huey has no batch enqueue.
"""

from __future__ import annotations

import logging
import time

from bench.peers.common import Measured, Spec, wait_for


def run(store: str, target: str, spec: Spec) -> Measured:
    from huey import SqliteHuey

    logging.getLogger("huey").setLevel(logging.WARNING)
    huey = SqliteHuey("bench", filename=f"{target}/huey.db")
    enqueued: dict[int, float] = {}
    done: dict[int, float] = {}

    @huey.task()
    def noop(i: int) -> None:
        done[i] = time.time()

    started = time.perf_counter()
    for i in range(spec.n):
        noop(i)
        enqueued[i] = time.time()
    enqueue_s = time.perf_counter() - started

    consumer = huey.create_consumer(workers=spec.workers, worker_type="thread", periodic=False)
    started = time.perf_counter()
    consumer.start()
    try:
        wait_for(lambda: len(done) >= spec.n, spec.timeout_s, "huey")
        process_s = time.perf_counter() - started
    finally:
        consumer.stop(graceful=True)
    assert huey.pending_count() == 0
    latencies = [done[i] - enqueued[i] for i in done]
    return Measured(enqueue_s, process_s, latencies, completed=len(done),
                    note="no batch enqueue in huey's API")
