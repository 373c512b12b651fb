"""Fairness: a noisy tenant costs quiet destinations nothing (``python -m bench delivery``).

On each store, in one run, the quiet world and the noisy world are measured with the same
drain cadence (a run every ``INTERVAL_S`` seconds, each with that budget less a margin):

- quiet: ``QUIET`` destinations, ``PER_QUIET`` entries each: Telegram private chats
  (their own rate: one a second) and webhook URLs on one shared host;
- noisy: the same, plus ``GROUP_BACKLOG`` entries to one Telegram group (its rate:
  ``GROUP_PER_MIN`` a minute), ``DEAD`` entries to a dead host (nothing listens), one
  poison entry on the shared host (its URL answers 500 to everything) and one URL on that
  host answering 410.

Each world's entries are enqueued at once, then drain runs follow each other until every
quiet entry is acked (or ``MAX_RUNS``). A row gives the quiet entries' p99 enqueue-to-ack
seconds in the noisy world against the quiet world (ratio = quiet / noisy: 1.0 is "the
noise costs nothing"); its note says whether that p99 is within the bound (one drain
interval plus the quiet destinations' own rate spacing, over the quiet world's p99) and
the group's achieved rate as a fraction of its configured rate.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.common import Row, row, scratch_database, scratch_sqlite
from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.delivery.channels import Outbound
from sluice.delivery.drain import Deliverer
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.jobs.registry import Deadline
from sluice.store.db import Database

QUIET = 20
PER_QUIET = 5
GROUP_BACKLOG = int(os.environ.get("SLUICE_BENCH_FAIR_GROUP", "3000"))
DEAD = int(os.environ.get("SLUICE_BENCH_FAIR_DEAD", "1000"))
GROUP_PER_MIN = 60
INTERVAL_S = float(os.environ.get("SLUICE_BENCH_FAIR_INTERVAL", "10"))
MARGIN_S = 1.0
MAX_RUNS = 6
SEND_TIMEOUT_S = 2.0
SECRET = "bench-fair-webhook-secret-0123456789"
GROUP = "-100900"
QUIET_SPACING_S = 1.0  # a Telegram private chat's own spacing (one a second)


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _services(db: Database, url: str, telegram: Any) -> Services:
    settings = Settings.from_env({
        "SLUICE_DATABASE_URL": url, "SLUICE_WEBHOOK_SIGNING_SECRET": SECRET,
        "SLUICE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
        "SLUICE_TELEGRAM_BOT_TOKEN": telegram.token, "SLUICE_TELEGRAM_API_URL": telegram.url,
        "SLUICE_TELEGRAM_GROUP_RATE_PER_MINUTE": str(GROUP_PER_MIN),
        "SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS": str(SEND_TIMEOUT_S)})
    return Services(settings, db, Reporter())


def _drains(services: Services, store: DeliveryStore, quiet_ids: set[str]) -> int:
    """Drain runs at the cadence until every quiet entry is acked: how many ran."""
    for n in range(1, MAX_RUNS + 1):
        started = time.monotonic()
        with Outbound.open(services.settings, deadline_s=INTERVAL_S) as client:
            deadline = Deadline(INTERVAL_S - MARGIN_S)
            Deliverer.from_services(services, client, deadline=deadline).drain(deadline)
        acked = {e.id for e in store.list(status=DeliveryStatus.ACKED, limit=500)}
        if quiet_ids <= acked:
            return n
        time.sleep(max(0.0, INTERVAL_S - (time.monotonic() - started)))
    return MAX_RUNS


def measure(db: Database, url: str, *, noisy: bool
            ) -> tuple[float, tuple[float | None, float | None], int]:
    """(quiet p99 enqueue-to-ack seconds, the group's rate as a fraction of its own while
    the runs could send and over the wall clock, runs)."""
    from tests.providers.telegram import TelegramStandIn
    from tests.providers.webhook import WebhookReceiver

    chats = tuple(str(3001 + n) for n in range(QUIET // 2))
    with (TelegramStandIn(chats=(GROUP, *chats)) as telegram,
          WebhookReceiver(SECRET) as hooks):
        services = _services(db, url, telegram)
        store = DeliveryStore(db)
        base = hooks.http.url
        hooks.scripts["/hooks/poison"] = [500] * 1_000_000
        hooks.scripts["/hooks/gone"] = [410] * 1_000_000
        if noisy:  # the noisy tenant's backlog is there first; the quiet entries arrive
            dead = f"http://127.0.0.1:{_dead_port()}/hook"
            store.enqueue("webhook", f"{base}/hooks/poison", {"text": "poison"})
            store.enqueue("webhook", f"{base}/hooks/gone", {"text": "gone"})
            for n in range(GROUP_BACKLOG):
                store.enqueue("telegram", GROUP, {"text": f"storm {n}"})
            for n in range(DEAD):
                store.enqueue("webhook", dead, {"text": f"dead {n}"})
        quiet: dict[str, float] = {}
        for n in range(PER_QUIET):
            for chat in chats:
                entry, _ = store.enqueue("telegram", chat, {"text": f"quiet {n}"})
                quiet[entry.id] = time.time()
            for k in range(QUIET - len(chats)):
                entry, _ = store.enqueue("webhook", f"{base}/hooks/quiet{k}",
                                         {"text": f"quiet {n}"})
                quiet[entry.id] = time.time()
        started = time.time()
        runs = _drains(services, store, set(quiet))
        elapsed = time.time() - started
        latencies = sorted(
            (e.acked_at.timestamp() - quiet[e.id]) for e in store.list(
                status=DeliveryStatus.ACKED, limit=500) if e.id in quiet and e.acked_at)
        missing = len(quiet) - len(latencies)
        latencies += [float("inf")] * missing
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        group = sum(1 for m in telegram.messages if m["chat_id"] == GROUP)
        # the group's slots over the time the runs could send (a run starts no send in its
        # last send timeout), and over the wall clock at this cadence
        sending = runs * (INTERVAL_S - MARGIN_S - SEND_TIMEOUT_S)
        fraction = group / (sending * GROUP_PER_MIN / 60) if noisy else None
        wall = group / (elapsed * GROUP_PER_MIN / 60) if noisy else None
    return p99, (fraction, wall), runs


@contextmanager
def _sqlite() -> Iterator[tuple[Database, str]]:
    with scratch_sqlite("fair") as found:
        yield found


@contextmanager
def _postgres() -> Iterator[tuple[Database, str]]:
    with scratch_database() as pg:
        yield pg, pg.conninfo


def _row(store: str, open_store: Callable[[], Any]) -> Row:
    with open_store() as (db, url):
        calm, _, calm_runs = measure(db, url, noisy=False)
    with open_store() as (db, url):
        loud, (fraction, wall), loud_runs = measure(db, url, noisy=True)
    bound = calm + INTERVAL_S + QUIET_SPACING_S
    return row(f"delivery: quiet destinations' p99 enqueue-to-ack beside a noisy tenant "
               f"vs alone ({store})", loud, calm, "s", False,
               note=f"{QUIET} quiet destinations x {PER_QUIET}; noise: {GROUP_BACKLOG:,} to one "
                    f"group ({GROUP_PER_MIN}/min), {DEAD:,} to a dead host, a poison entry "
                    f"and a 410 URL on the quiet webhooks' host; drain every {INTERVAL_S:g} s; "
                    f"within the bound (alone + one interval + {QUIET_SPACING_S:g} s spacing = "
                    f"{bound:.1f} s): {loud <= bound}; group drained at "
                    f"{(fraction or 0):.2f} of its rate while the runs could send "
                    f"({(wall or 0):.2f} of the wall clock at this cadence); runs {calm_runs} "
                    f"and {loud_runs}")


def run() -> list[Row]:
    return [_row("SQLite", _sqlite), _row("Postgres", _postgres)]
