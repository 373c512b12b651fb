"""The delivery queue's durable path: enqueue before the send, ack after it, one message at a time.

Sluice (``DeliveryStore.enqueue`` with a lease, then ``ack``: one statement and one commit
each, two a message, the minimum: one before the send, one after) against the strongest
references doing the same durable work:

- SQLite: plain ``sqlite3`` on one long-lived connection with Sluice's PRAGMAs (WAL, default
  ``synchronous``), an INSERT and an UPDATE each committed, into the same table;
  persist-queue's ``SQLiteAckQueue`` (``put``, ``get``, ``ack``, each committed, WAL: the
  library's own durable API, three commits a message); and one JSON file per message
  (write, fsync, rename, fsync the directory; the ack renames into ``acked/`` and fsyncs).
  The three SQLite sides' ``journal_mode`` and ``synchronous`` are read back and must be
  equal (WAL, FULL), or the run stops: no side is measured at a weaker durability.
- Postgres: plain psycopg on one autocommit connection, an INSERT and an UPDATE (two commits,
  two round trips, prepared), into the same table.

``REPEATS`` repetitions, each on fresh databases: ``ROUNDS`` interleaved rounds of
``PER_ROUND`` messages a side (the order reversed every other round). A repetition's ratio
is the median over its rounds of Sluice's rate against the baseline's in the same round; a
row gives the repetition whose ratio is the median, and the range over the repetitions.
persist-queue is installed by the ``bench`` extra.
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

from bench import delivery_destinations, delivery_fair, delivery_held, delivery_replay
from bench.common import Row, median, row, scratch_database
from sluice.delivery.store import DeliveryStore
from sluice.store.db import SqliteDatabase, open_database, utcnow
from sluice.store.migrate import migrate

REPEATS = int(os.environ.get("SLUICE_BENCH_DELIVERY_REPEATS", "3"))
ROUNDS = int(os.environ.get("SLUICE_BENCH_DELIVERY_ROUNDS", "9"))
PER_ROUND = int(os.environ.get("SLUICE_BENCH_DELIVERY_MESSAGES", "120"))
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


Durability = tuple[str, int]  # (journal_mode, synchronous) of a side's connection


def _durability_of(conn: sqlite3.Connection) -> Durability:
    return (conn.execute("PRAGMA journal_mode").fetchone()[0],
            conn.execute("PRAGMA synchronous").fetchone()[0])


def _plain_sqlite(path: str) -> tuple[Callable[[int], None], Durability]:
    conn = sqlite3.connect(path, isolation_level=None)
    # Sluice's PRAGMAs (SqliteDatabase._connect); synchronous left at its default, as there.
    for pragma in ("journal_mode=WAL", "foreign_keys=ON", "busy_timeout=30000",
                   "case_sensitive_like=ON"):
        conn.execute(f"PRAGMA {pragma}")
    insert, ack = INSERT.format(p="?"), ACK.format(p="?")

    def send(n: int) -> None:
        entry_id, now = str(uuid.uuid4()), utcnow()
        lease = now + LEASE
        conn.execute(insert, (entry_id, json.dumps(PAYLOAD), lease, lease, now, now))
        assert conn.execute(ack, (f"m-{n}", utcnow(), utcnow(), entry_id)).rowcount == 1
    return send, _durability_of(conn)


def _persist_queue(path: str) -> tuple[Callable[[int], None], Durability]:
    from persistqueue import SQLiteAckQueue  # type: ignore[import-untyped]

    queue = SQLiteAckQueue(path, auto_commit=True)

    def send(n: int) -> None:
        queue.put({"channel": "webhook", "recipient": "ops", "payload": PAYLOAD})
        item = queue.get(block=False)
        queue.ack(item)
    return send, _durability_of(queue._putter)  # the connection its writes go through


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


Rounds = dict[str, list[float]]  # side -> messages/s of each round, in order


def interleaved(sides: dict[str, Callable[[int], None]]) -> Rounds:
    """Messages/s of each side in each of ``ROUNDS`` interleaved rounds, the order of the
    sides reversed every other round (whatever runs first or last in a round gets no edge)."""
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for name, send in sides.items():  # warm up
        for n in range(10):
            send(n)
    order = list(sides.items())
    for _ in range(ROUNDS):
        for name, send in order:
            start = time.perf_counter()
            for n in range(PER_ROUND):
                send(n)
            samples[name].append(PER_ROUND / (time.perf_counter() - start))
        order.reverse()
    return samples


def _durability(rows: list[Durability]) -> str:
    """The one (journal_mode, synchronous) every side runs with; refuses a mismatch."""
    if len(set(rows)) != 1:
        raise AssertionError(f"the sides differ in durability settings: {rows}")
    journal, synchronous = rows[0]
    return f"journal_mode={journal}, synchronous={synchronous} on every side (checked)"


def _sqlite_repetition(tmp: str) -> tuple[Rounds, str]:
    db = open_database(f"sqlite:///{tmp}/sluice.db")
    assert isinstance(db, SqliteDatabase)
    migrate(db)
    plain = f"{tmp}/plain.db"
    reference = open_database(f"sqlite:///{plain}")
    migrate(reference)
    reference.close()
    files = Path(tmp) / "files"
    files.mkdir()
    plain_send, plain_durability = _plain_sqlite(plain)
    queue_send, queue_durability = _persist_queue(f"{tmp}/persist-queue")
    with db.transaction() as tx:
        journal = tx.fetchone("PRAGMA journal_mode")
        synchronous = tx.fetchone("PRAGMA synchronous", final=True)
    assert journal is not None and synchronous is not None
    durability = _durability([(journal["journal_mode"], synchronous["synchronous"]),
                              plain_durability, queue_durability])
    sides = {"sluice": _sluice(DeliveryStore(db)), "plain": plain_send,
             "persist-queue": queue_send, "files": _json_files(files)}
    try:
        return interleaved(sides), durability
    finally:
        db.close()


def _postgres_repetition() -> Rounds:
    with scratch_database() as pg:
        send, close = _plain_psycopg(pg.conninfo)
        try:
            return interleaved({"sluice": _sluice(DeliveryStore(pg)), "plain": send})
        finally:
            close()


def _median_ratio(reps: list[Rounds], baseline: str) -> tuple[float, float, float, str]:
    """(Sluice, baseline, ratio) of the repetition whose ratio is the median, and the range.

    A repetition's ratio is the median over its rounds of Sluice's rate against the
    baseline's in the same round (run next to each other, so a burst of load from outside
    hits both); its rates are each side's median round."""
    found = []
    for rep in reps:
        ratio = median([a / b for a, b in zip(rep["sluice"], rep[baseline], strict=True)])
        found.append((ratio, median(rep["sluice"]), median(rep[baseline])))
    found.sort()
    ratio, sluice, base = found[len(found) // 2]
    spread = f"ratios {found[0][0]:.2f}-{found[-1][0]:.2f}x over {len(reps)} repetitions"
    return sluice, base, ratio, spread


def _row(name: str, reps: list[Rounds], baseline: str, note: str) -> Row:
    sluice, base, ratio, spread = _median_ratio(reps, baseline)
    result = row(name, sluice, base, "msg/s", True, note=f"{spread}; {note}")
    result["ratio"] = ratio  # the median of per-round ratios, not the ratio of medians
    return result


def run() -> list[Row]:
    each = (f"msg/s; {REPEATS} repetitions of {ROUNDS} interleaved rounds of {PER_ROUND}; "
            "ratio: the median repetition's median per-round ratio")
    sqlite_reps: list[Rounds] = []
    durability = ""
    postgres_reps: list[Rounds] = []
    for _ in range(REPEATS):  # the engines alternate too, so neither gets the quieter minutes
        with tempfile.TemporaryDirectory(dir=os.environ.get("SLUICE_BENCH_TMP")) as tmp:
            rates, durability = _sqlite_repetition(tmp)
            sqlite_reps.append(rates)
        postgres_reps.append(_postgres_repetition())
    _, _, plain_vs_queue, _ = _median_ratio(
        [{"sluice": rep["plain"], "persist-queue": rep["persist-queue"]} for rep in sqlite_reps],
        "persist-queue")
    return [
        _row("delivery: durable send+ack, SQLite vs plain sqlite3 (same PRAGMAs)",
             sqlite_reps, "plain",
             f"{each}; Sluice: enqueue (one INSERT) + ack (one UPDATE), 2 commits a message; "
             f"plain: INSERT + UPDATE, 2 commits; {durability}"),
        _row("delivery: durable send+ack, SQLite vs persist-queue SQLiteAckQueue",
             sqlite_reps, "persist-queue",
             f"persist-queue: put + get + ack, 3 commits; {durability}; plain sqlite3 itself "
             f"vs persist-queue: {plain_vs_queue:.2f}x"),
        _row("delivery: durable send+ack, SQLite vs one JSON file per message",
             sqlite_reps, "files",
             "files: write + fsync + rename + fsync dir; ack: rename + fsync dirs"),
        _row("delivery: durable send+ack, Postgres vs plain psycopg", postgres_reps, "plain",
             f"{each}; 2 round trips a message each (Sluice: autocommit INSERT, autocommit "
             "UPDATE; plain: the same, prepared)"),
        *delivery_held.run(),
        *delivery_fair.run(),
        *delivery_replay.run(),
        *delivery_destinations.run(),
    ]


if __name__ == "__main__":
    for result in run():
        print(result)


__all__: list[Any] = ["run"]
