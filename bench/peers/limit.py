"""The machine's own limit, measured in the same run: commits per second of a one-row
INSERT, each its own transaction, at the durability every side runs with (Postgres:
the server's ``synchronous_commit``, read back; SQLite: WAL at SQLite's default
``synchronous``, FULL, as Sluice, huey and persist-queue leave it).

On Postgres with one connection and with as many as the workers (concurrent commits
share a WAL flush, so more connections may commit more a second); SQLite takes one
writer at a time, so one connection is its limit.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import NamedTuple

from bench.peers.common import fresh_postgres

SECONDS = 2.0  # each measurement's length
TABLE = "CREATE TABLE commits (id bigint PRIMARY KEY, at double precision NOT NULL)"


class Limit(NamedTuple):
    one: float  # commits/s, one connection
    many: float  # commits/s, ``connections`` at once
    connections: int
    durability: str

    @property
    def best(self) -> float:
        return max(self.one, self.many)


def _pg_inserts(url: str, first: int, until: float) -> int:
    import psycopg

    done = 0
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < until:
            conn.execute("INSERT INTO commits VALUES (%s, %s)", (first + done, time.time()),
                         prepare=True)
            done += 1
    return done


def postgres(workers: int) -> Limit:
    import psycopg

    with fresh_postgres("limit") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(TABLE)
            row = conn.execute("SHOW synchronous_commit").fetchone()
            durability = f"synchronous_commit={row[0] if row else '?'}"
        one = _pg_inserts(url, 0, time.monotonic() + SECONDS) / SECONDS
        counts = [0] * workers
        until = time.monotonic() + SECONDS

        def insert(n: int) -> None:
            counts[n] = _pg_inserts(url, (n + 1) * 10_000_000, until)

        threads = [threading.Thread(target=insert, args=(n,)) for n in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return Limit(one, sum(counts) / SECONDS, workers, durability)


def sqlite(folder: str) -> Limit:
    conn = sqlite3.connect(f"{folder}/limit.db", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(TABLE)
        durability = (f"journal_mode={conn.execute('PRAGMA journal_mode').fetchone()[0]}, "
                      f"synchronous={conn.execute('PRAGMA synchronous').fetchone()[0]}")
        done, until = 0, time.monotonic() + SECONDS
        while time.monotonic() < until:
            conn.execute("INSERT INTO commits VALUES (?, ?)", (done, time.time()))
            done += 1
    finally:
        conn.close()
    return Limit(done / SECONDS, done / SECONDS, 1, durability)
