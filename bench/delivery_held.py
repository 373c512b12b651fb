"""A dead destination's backlog costs a drain nothing (``python -m bench delivery``).

On each store, 300 and then 3,000 entries wait held on one dead webhook host (nothing
listens on its port: every request is refused, a transient "not connected"), held by
a first drain that found the host failing (untimed setup). Then 20 healthy entries to a
live receiver are enqueued and the host's probe is made due, and one drain runs: the
real ``delivery-drain`` with the real webhook adapter, the stand-in receiver of the
tests. A row gives that drain's seconds with 3,000 held against 300 (the median of
``REPEATS`` drains each; ratio = 300's time / 3,000's, so 0.5 or more is "within 2x"),
and in its note whether the 20 were delivered by that first drain and how many rows
the drain touched (the probe and the 20: the backlog is out of the claim's index). The
same again with the backlog held by an operator's pause of the host instead (the first drain
takes each entry once and holds it): the 20 and nothing else are touched, and no probe.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from bench.common import Row, median, row, scratch_store
from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.delivery.channels import Outbound
from sluice.delivery.destinations import Destinations
from sluice.delivery.drain import Deliverer
from sluice.delivery.store import DeliveryStore
from sluice.jobs.registry import Deadline
from sluice.store.db import Database, utcnow

HELD = (300, 3000)
HEALTHY = 20
REPEATS = int(os.environ.get("SLUICE_BENCH_DELIVERY_HELD_REPEATS", "3"))
SECRET = "bench-held-webhook-secret-0123456789"


def _dead_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again: nothing listens there


def _services(db: Database, url: str) -> Services:
    settings = Settings.from_env({
        "SLUICE_DATABASE_URL": url, "SLUICE_WEBHOOK_SIGNING_SECRET": SECRET,
        "SLUICE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1", "SLUICE_WEBHOOK_HOST_RATE_PER_SECOND": "10000",
        "SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS": "5"})
    return Services(settings, db, Reporter())


def _drain(services: Services) -> float:
    with Outbound.open(services.settings) as client:
        deliverer = Deliverer.from_services(services, client, deadline=Deadline(50))
        started = time.perf_counter()
        summary = deliverer.drain(Deadline(50))
        elapsed = time.perf_counter() - started
    assert summary["failed"] == 0, summary
    return elapsed


def _touched(db: Database, since: Any) -> int:
    with db.transaction() as tx:
        found = tx.fetchone("SELECT count(*) AS n FROM delivery_queue WHERE updated_at > :since",
                            {"since": since})
    return int(found["n"]) if found else 0


def measure(db: Database, url: str, held: int, *, paused: bool = False
            ) -> tuple[float, bool, int]:
    """(median drain seconds, the 20 delivered by each first drain, rows touched)."""
    from tests.providers.webhook import WebhookReceiver

    services = _services(db, url)
    store = DeliveryStore(db)
    port = _dead_port()
    dead = f"http://127.0.0.1:{port}/hook"
    if paused:
        Destinations(db, 3).pause(f"webhook:127.0.0.1:{port}", utcnow() + timedelta(days=1))
    for n in range(held):
        store.enqueue("webhook", dead, {"text": f"held {n}"})
    _drain(services)  # setup: the host is found failing (or paused) and its entries held
    times, delivered, touched = [], True, 0
    with WebhookReceiver(SECRET) as receiver:
        for repeat in range(REPEATS):
            for n in range(HEALTHY):
                store.enqueue("webhook", receiver.url, {"text": f"healthy {repeat}.{n}"})
            with db.transaction() as tx:  # the dead host's next probe is due
                tx.execute("UPDATE delivery_destinations SET next_probe_at = :now",
                           {"now": utcnow() - timedelta(seconds=1)})
            since = utcnow()
            times.append(_drain(services))
            delivered = delivered and len(receiver.delivered) == HEALTHY * (repeat + 1)
            touched = max(touched, _touched(db, since))
    return median(times), delivered, touched


def _row(store: str, dialect: str, *, paused: bool = False) -> Row:
    found = {}
    for held in HELD:
        with scratch_store(dialect) as (db, url):
            found[held] = measure(db, url, held, paused=paused)
    (small, small_ok, small_rows), (big, big_ok, big_rows) = found[HELD[0]], found[HELD[1]]
    on = "a paused destination" if paused else "a dead destination"
    touched = f"the {HEALTHY}" if paused else f"the probe and the {HEALTHY}"
    return row(f"delivery: drain with {HELD[1]:,} held on {on} vs {HELD[0]} "
               f"({store})", big, small, "s", False,
               note=f"plus {HEALTHY} healthy entries, all delivered by the first drain: "
                    f"{small_ok and big_ok}; rows the drain touched: {small_rows} and "
                    f"{big_rows} ({touched}); median of {REPEATS} drains; "
                    "ratio 0.5 or more = within 2x")


def run() -> list[Row]:
    return [_row("SQLite", "sqlite"), _row("Postgres", "postgres"),
            _row("SQLite", "sqlite", paused=True), _row("Postgres", "postgres", paused=True)]


__all__ = ["measure", "run"]
