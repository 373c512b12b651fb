"""persist-queue's side (SQLite: ``SQLiteAckQueue``, its durable queue, auto commit).

``put`` one item at a time (one commit each); then the workers, threads sharing the
queue, each ``get`` an item (its status set to unacked, committed) and ``ack`` it
(committed) until none is left. Latency: ``put``'s return to ``ack``'s return (this
process's clock). persist-queue has no batch put that commits once.
"""

from __future__ import annotations

import threading
import time

from bench.peers.common import Measured, Spec


def run(store: str, target: str, spec: Spec) -> Measured:
    from persistqueue import SQLiteAckQueue  # type: ignore[import-untyped]
    from persistqueue.exceptions import Empty  # type: ignore[import-untyped]

    queue = SQLiteAckQueue(f"{target}/persist-queue", multithreading=True, auto_commit=True)
    enqueued: dict[int, float] = {}
    done: dict[int, float] = {}

    started = time.perf_counter()
    for i in range(spec.n):
        queue.put(i)
        enqueued[i] = time.time()
    enqueue_s = time.perf_counter() - started

    def work() -> None:
        while True:
            try:
                item = queue.get(block=False)
            except Empty:
                return
            queue.ack(item)
            done[item] = time.time()

    threads = [threading.Thread(target=work) for _ in range(spec.workers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(spec.timeout_s)
    process_s = time.perf_counter() - started
    assert queue.acked_count() == spec.n, queue.acked_count()
    latencies = [done[i] - enqueued[i] for i in done]
    return Measured(enqueue_s, process_s, latencies, completed=len(done),
                    note="no batch put in persist-queue's ack queue")
