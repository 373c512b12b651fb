"""DBOS's side: durable workflows on a DBOS queue (Postgres, and SQLite, its own default).

The system database is created by a first ``DBOS.launch()``; jobs are enqueued as a
producer outside the worker process does, ``DBOSClient.enqueue`` one call at a time,
each a no-op workflow; then ``DBOS.launch()`` with the workers as its executor threads
(``max_executor_threads``) and the queue at its defaults (polling once a second, no
per-process limit: the threads are the limit), until every workflow is ``SUCCESS``.
A workflow's start and its result are each committed. Latency: ``updated_at`` less
``created_at`` of its status row (milliseconds since the epoch).
"""

from __future__ import annotations

import logging
import sqlite3
import time

from bench.peers.common import Measured, Spec, pg_rows, wait_for

DONE = "SELECT count(*) FROM {t} WHERE queue_name = 'bench' AND status = 'SUCCESS'"
LATENCIES = ("SELECT created_at, updated_at FROM {t} "
             "WHERE queue_name = 'bench' AND status = 'SUCCESS'")


def _noop() -> None:
    return None


def run(store: str, target: str, spec: Spec) -> Measured:
    from dbos import DBOS, DBOSClient

    DBOS.workflow(name="noop")(_noop)  # registered before the first launch, by the name enqueued

    logging.getLogger("dbos").setLevel(logging.WARNING)
    url = target if store == "postgres" else f"sqlite:///{target}/dbos.sqlite"
    table = "dbos.workflow_status" if store == "postgres" else "workflow_status"

    def query(sql: str) -> list[tuple[int, ...]]:
        if store == "postgres":
            return pg_rows(url, sql.format(t=table))
        with sqlite3.connect(f"{target}/dbos.sqlite") as conn:
            return list(conn.execute(sql.format(t=table)).fetchall())

    config = {"name": "bench", "system_database_url": url, "log_level": "WARNING"}
    DBOS(config=config)  # type: ignore[arg-type]
    DBOS.launch()  # creates the system database
    DBOS.destroy()

    client = DBOSClient(system_database_url=url)
    client.register_queue("bench")
    started = time.perf_counter()
    for _ in range(spec.n):
        client.enqueue({"queue_name": "bench", "workflow_name": "noop"})
    enqueue_s = time.perf_counter() - started
    client.destroy()

    DBOS(config={**config, "max_executor_threads": spec.workers})  # type: ignore[typeddict-unknown-key]
    started = time.perf_counter()
    DBOS.launch()
    DBOS.register_queue("bench")
    wait_for(lambda: query(DONE)[0][0] >= spec.n, spec.timeout_s, "dbos")
    process_s = time.perf_counter() - started
    DBOS.destroy()

    rows = query(LATENCIES)
    latencies = [(done - created) / 1000 for created, done in rows]
    return Measured(enqueue_s, process_s, latencies, completed=len(rows),
                    note="no batch enqueue measured")



