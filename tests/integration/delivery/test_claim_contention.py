"""Claims by separate senders (each its own connection, as separate functions are) and
what one claim costs, on both stores.

* A claim that starts while another is still open waits for it, then takes the entries
  after the ones it took: it never reaches for entries another claim just took. Before
  the queue's turn (``queue_turn`` in delivery.sql), the second claim locked the same
  entries as the first, found them taken when the first committed and came back empty;
  with the senders' marks and settles in between, two senders locked the same entries
  in different orders and Postgres aborted one of them (``deadlock detected``).
* Many senders draining one queue of thousands of chats: every entry claimed once, no
  store error.
* One claim among 3,000 chats reads what it takes, not the queue: the same work as among
  300. Measured as work, not time: the rows Postgres reads from ``delivery_queue``
  (``EXPLAIN ANALYZE``) and the steps SQLite's virtual machine takes (a progress handler).
  Before the claim's own index, on a table whose statistics were not gathered yet (a bulk
  enqueue), the planner read each receiver's entries off the queue-wide due index,
  filtering every other receiver's: 10 s a claim among 3,000 chats.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

from sluice.delivery.policy import DeliveryOutcome
from sluice.delivery.store import PACED_WINDOW, DeliveryStore, NewEntry, Q, Settle
from sluice.store.db import Database, open_database, utcnow
from tests.store_work import sqlite_steps

LEASE = timedelta(minutes=10)


def _chats(store: DeliveryStore, chats: int, each: int) -> None:
    """``each`` entries to each of ``chats`` Telegram chats, stored in bulk."""
    items = [NewEntry("telegram", str(100_000 + n % chats), {"text": f"m{n}"})
             for n in range(chats * each)]
    for start in range(0, len(items), 1000):
        store.enqueue_many(items[start:start + 1000])


class _Holding:
    """A database whose claim transaction stops after the claim statement until released,
    still open: the claim of another sender starts meanwhile."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.dialect = db.dialect
        self.claimed = threading.Event()
        self.release = threading.Event()

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        with self.db.transaction() as tx:
            yield _HoldingTx(tx, self)

    def close(self) -> None:
        self.db.close()


class _HoldingTx:
    def __init__(self, tx: Any, holding: _Holding) -> None:
        self.tx, self.holding = tx, holding

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tx, name)

    def fetchall(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        rows = self.tx.fetchall(query, params, **kwargs)
        if query is Q.claim:
            self.holding.claimed.set()
            assert self.holding.release.wait(30)
        return rows


def _waiting_on_a_lock(db: Database) -> bool:
    if db.dialect != "postgres":
        return True  # SQLite: the second writer waits for the first by design
    with db.transaction() as tx:
        row = tx.fetchone("SELECT count(*) AS n FROM pg_stat_activity "
                          "WHERE datname = current_database() AND wait_event_type = 'Lock'")
    return bool(row and row["n"])


def test_a_claim_waits_for_the_open_one_and_takes_the_entries_after_its(db_url: str) -> None:
    first_db, second_db = open_database(db_url), open_database(db_url)
    try:
        holding = _Holding(first_db)
        first, second = DeliveryStore(holding), DeliveryStore(second_db)  # type: ignore[arg-type]
        _chats(second, chats=40, each=1)
        taken: dict[str, list[str]] = {}

        def claim(name: str, store: DeliveryStore) -> None:
            taken[name] = [e.id for e in store.claim(LEASE, limit=10, per_round=1)]

        a = threading.Thread(target=claim, args=("first", first))
        a.start()
        assert holding.claimed.wait(30)
        b = threading.Thread(target=claim, args=("second", second))
        b.start()
        deadline = time.monotonic() + 10
        while not _waiting_on_a_lock(second_db) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        holding.release.set()
        a.join(30)
        b.join(30)
        assert len(taken["first"]) == 10
        assert len(taken["second"]) == 10, "the second claim came back short"
        assert not set(taken["first"]) & set(taken["second"])
    finally:
        first_db.close()
        second_db.close()


@pytest.mark.timeout(300)
def test_senders_on_their_own_connections_claim_mark_and_settle_thousands_of_chats(
        db_url: str) -> None:
    setup = open_database(db_url)
    _chats(DeliveryStore(setup), chats=1500, each=2)
    setup.close()
    claimed: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def sender() -> None:
        db = open_database(db_url)
        store = DeliveryStore(db)
        acked = store.policy.decide(DeliveryOutcome.ACKED)
        try:
            while True:
                got = store.claim(LEASE, limit=64, per_round=1)
                if not got:
                    return
                left = store.requests_left(got)
                store.settle([Settle(e, acked, duration_ms=1, message_id="m")
                              for e in got if e.id in left])
                with lock:
                    claimed.extend(e.id for e in got)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)
        finally:
            db.close()

    threads = [threading.Thread(target=sender) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    assert not errors, errors[0]
    assert len(claimed) == 3000 == len(set(claimed))
    stats = DeliveryStore(open_database(db_url)).stats()
    assert stats["acked"]["count"] == 3000


def _claim_params() -> dict[str, Any]:
    now = utcnow()
    return {"now": now, "lease_until": now + LEASE, "limit": 256, "per_round": 4,
            "after": "", "paced_since": now - PACED_WINDOW, "channels": None}


def _postgres_rows_read(db: Database) -> int:
    """The rows the claim read from ``delivery_queue``, returned or filtered out, over all
    the loops of each scan."""
    read = 0

    def walk(node: dict[str, Any]) -> None:
        nonlocal read
        if node.get("Relation Name") == "delivery_queue":
            loops = int(node.get("Actual Loops", 1))
            read += loops * (int(node["Actual Rows"]) + int(node.get("Rows Removed by Filter", 0)))
        for child in node.get("Plans", []):
            walk(child)

    with db.transaction() as tx:
        [row] = tx.fetchall("EXPLAIN (ANALYZE, FORMAT JSON) " + Q.claim.for_dialect("postgres"),
                            _claim_params())
    [top] = next(iter(row.values()))
    walk(top["Plan"])
    return read


def _sqlite_steps(db: Database) -> int:
    steps, found = sqlite_steps(db.path, Q.claim.for_dialect("sqlite"),  # type: ignore[attr-defined]
                                _claim_params(), every=100)
    assert len(found) == 256
    return steps


@pytest.mark.timeout(300)
def test_one_claim_among_3000_chats_reads_what_it_takes_as_among_300(db: Database) -> None:
    work = {}
    for chats in (300, 3000):
        with db.transaction() as tx:
            tx.execute("DELETE FROM delivery_queue")
        _chats(DeliveryStore(db), chats=chats, each=4)
        work[chats] = _postgres_rows_read(db) if db.dialect == "postgres" else _sqlite_steps(db)
    assert work[3000] <= 1.5 * work[300], work
    if db.dialect == "postgres":  # each of the 256 receivers walked: a probe and its 4
        assert work[3000] <= 8 * 256, work
