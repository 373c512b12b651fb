"""The delivery queue's durable path: enqueue before the send, ack after it, one message at a time.

Sluice (``DeliveryStore.enqueue`` with a lease, then ``ack``: two commits a message) against
the strongest references doing the same durable work:

- SQLite: plain ``sqlite3`` on one long-lived connection with Sluice's PRAGMAs (WAL, default
  ``synchronous``), an INSERT and an UPDATE each committed, into the same table;
  persist-queue's ``SQLiteAckQueue`` (``put``, ``get``, ``ack``, each committed, WAL: the
  library's own durable API, three commits a message); and one JSON file per message
  (write, fsync, rename, fsync the directory; the ack renames into ``acked/`` and fsyncs).
- Postgres: plain psycopg on one autocommit connection, an INSERT and an UPDATE (two commits,
  two round trips), into the same table.

Both sides run interleaved, ``ROUNDS`` rounds of ``PER_ROUND`` messages each; the figure is
the median of the rounds' messages/s. persist-queue is installed by the ``bench`` extra.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import Row, median, row, scratch_database
from shared.delivery.store import DeliveryStore
from shared.store.db import SqliteDatabase, open_database, utcnow
from shared.store.migrate import migrate

ROUNDS = int(os.environ.get("SLUICE_BENCH_DELIVERY_ROUNDS", "5"))
PER_ROUND = int(os.environ.get("SLUICE_BENCH_DELIVERY_MESSAGES", "200"))
LEASE = timedelta(minutes=2)
PAYLOAD = {"text": "Build 1432 finished", "url": "https://example.com/builds/1432"}

INSERT = ("INSERT INTO delivery_queue (id, channel, recipient, payload, status, attempts, "
          "next_attempt_at, lease_until, enqueued_at, updated_at) "
          "VALUES ({p}, 'webhook', 'ops', {p}, 'in_flight', 1, {p}, {p}, {p}, {p})")
ACK = ("UPDATE delivery_queue SET status = 'acked', platform_message_id = {p}, "
       "duration_ms = 1, acked_at = {p}, updated_at = {p}, lease_until = NULL "
       "WHERE id = {p} AND status = 'in_flight' AND attempts = 1")


def _sluice(store: DeliveryStore) -> Callable[[int], None]:
    def send(n: int) -> None:
        entry, _ = store.enqueue("webhook", "ops", PAYLOAD, lease=LEASE)
        assert store.ack(entry, f"m-{n}", 1)
    return send


def _plain_sqlite(path: str) -> Callable[[int], None]:
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in ("journal_mode=WAL", "foreign_keys=ON", "busy_timeout=30000",
                   "case_sensitive_like=ON"):
        conn.execute(f"PRAGMA {pragma}")
    insert, ack = INSERT.format(p="?"), ACK.format(p="?")

    def send(n: int) -> None:
        entry_id, now = str(uuid.uuid4()), utcnow()
        lease = now + LEASE
        conn.execute(insert, (entry_id, json.dumps(PAYLOAD), lease, lease, now, now))
        assert conn.execute(ack, (f"m-{n}", utcnow(), utcnow(), entry_id)).rowcount == 1
    return send


def _persist_queue(path: str) -> Callable[[int], None]:
    from persistqueue import SQLiteAckQueue  # type: ignore[import-untyped]

    queue = SQLiteAckQueue(path, auto_commit=True)

    def send(n: int) -> None:
        queue.put({"channel": "webhook", "recipient": "ops", "payload": PAYLOAD})
        item = queue.get(block=False)
        queue.ack(item)
    return send


def _json_files(root: Path) -> Callable[[int], None]:
    pending, acked = root / "pending", root / "acked"
    pending.mkdir()
    acked.mkdir()

    def fsync_dir(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def send(n: int) -> None:
        entry_id = str(uuid.uuid4())
        tmp, final = pending / f".{entry_id}.tmp", pending / f"{entry_id}.json"
        with open(tmp, "w") as handle:
            json.dump({"id": entry_id, "channel": "webhook", "recipient": "ops",
                       "payload": PAYLOAD, "status": "in_flight"}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(tmp, final)
        fsync_dir(pending)
        os.rename(final, acked / final.name)
        fsync_dir(acked)
        fsync_dir(pending)
    return send


def _plain_psycopg(url: str) -> tuple[Callable[[int], None], Callable[[], None]]:
    import psycopg
    from psycopg.types.json import Jsonb

    conn = psycopg.connect(url, autocommit=True)
    insert, ack = INSERT.format(p="%s"), ACK.format(p="%s")

    def send(n: int) -> None:
        entry_id, now = str(uuid.uuid4()), utcnow()
        lease = now + LEASE
        conn.execute(insert, (entry_id, Jsonb(PAYLOAD), lease, lease, now, now), prepare=True)
        cur = conn.execute(ack, (f"m-{n}", utcnow(), utcnow(), entry_id), prepare=True)
        assert cur.rowcount == 1
    return send, conn.close


def interleaved(sides: dict[str, Callable[[int], None]]) -> dict[str, float]:
    """Messages/s of each side: the median of ``ROUNDS`` interleaved rounds."""
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for name, send in sides.items():  # warm up
        for n in range(10):
            send(n)
    for _ in range(ROUNDS):
        for name, send in sides.items():
            start = time.perf_counter()
            for n in range(PER_ROUND):
                send(n)
            samples[name].append(PER_ROUND / (time.perf_counter() - start))
    return {name: median(values) for name, values in samples.items()}


def run() -> list[Row]:
    rows: list[Row] = []
    note = (f"msg/s, median of {ROUNDS} interleaved rounds of {PER_ROUND}; Sluice: 2 commits "
            "a message (enqueue, ack)")
    with tempfile.TemporaryDirectory(dir=os.environ.get("SLUICE_BENCH_TMP")) as tmp:
        url = f"sqlite:///{tmp}/sluice.db"
        db = open_database(url)
        assert isinstance(db, SqliteDatabase)
        migrate(db)
        plain = f"{tmp}/plain.db"
        reference = open_database(f"sqlite:///{plain}")
        migrate(reference)
        reference.close()
        files = Path(tmp) / "files"
        files.mkdir()
        rates = interleaved({
            "sluice": _sluice(DeliveryStore(db)),
            "plain": _plain_sqlite(plain),
            "persist-queue": _persist_queue(f"{tmp}/persist-queue"),
            "files": _json_files(files),
        })
        db.close()
    rows.append(row("delivery: durable send+ack, SQLite vs plain sqlite3 (same PRAGMAs)",
                    rates["sluice"], rates["plain"], "msg/s", True,
                    note=note + "; plain: INSERT + UPDATE, 2 commits"))
    rows.append(row("delivery: durable send+ack, SQLite vs persist-queue SQLiteAckQueue",
                    rates["sluice"], rates["persist-queue"], "msg/s", True,
                    note="persist-queue: put + get + ack, 3 commits, WAL"))
    rows.append(row("delivery: durable send+ack, SQLite vs one JSON file per message",
                    rates["sluice"], rates["files"], "msg/s", True,
                    note="files: write + fsync + rename + fsync dir; ack: rename + fsync dirs"))
    with scratch_database() as pg:
        send, close = _plain_psycopg(pg.conninfo)
        try:
            rates = interleaved({"sluice": _sluice(DeliveryStore(pg)), "plain": send})
        finally:
            close()
    rows.append(row("delivery: durable send+ack, Postgres vs plain psycopg",
                    rates["sluice"], rates["plain"], "msg/s", True,
                    note=note + ", 2 round trips (enqueue: BEGIN, INSERT, SELECT and COMMIT "
                               "pipelined; ack: one autocommit UPDATE); plain: autocommit "
                               "INSERT + UPDATE, 2 round trips, prepared"))
    return rows


if __name__ == "__main__":
    for result in run():
        print(result)


__all__: list[Any] = ["run"]
