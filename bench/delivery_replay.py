"""A replay reads its window a page at a time (``python -m bench delivery``).

On Postgres, ``SLUICE_BENCH_REPLAY_ENTRIES`` failed entries (default 20,000) of one webhook
destination and as many of another are in the window. Sluice's replay
(``sluice.delivery.replay``: 500 entries a read, each page's chosen entries restarted in one
statement) against the one-shot way (one read of the whole window, one restart of every
chosen entry), both through the same adapters and the same restart statement. Rows: the
peak of Python memory while each runs (``tracemalloc``; lower is better) and entries made
due a second; notes give the statements each ran.
"""

from __future__ import annotations

import os
import time
import tracemalloc
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from bench.common import Row, row, scratch_database
from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.delivery.channels import Outbound
from sluice.delivery.policy import DeliveryOutcome
from sluice.delivery.replay import BATCH, Replay, ReplayFilter
from sluice.delivery.store import DeliveryStatus
from sluice.store.db import Database, utcnow

ENTRIES = int(os.environ.get("SLUICE_BENCH_REPLAY_ENTRIES", "20000"))
HOOK = "http://127.0.0.1:9/hooks/replayed"
OTHER = "http://127.0.0.1:10/hooks/other"
TEXT = "an alert of a few hundred characters, " * 6


def _fill(db: Database, n: int) -> None:
    now = utcnow()
    with db.transaction() as tx:
        tx.execute("""
            INSERT INTO delivery_queue (id, channel, recipient, payload, idempotency_key,
                status, attempts, next_attempt_at, enqueued_at, updated_at, failed_at,
                failure_reason, last_error)
            SELECT 'e-' || i, 'webhook', CASE WHEN i % 2 = 0 THEN :hook ELSE :other END,
                   jsonb_build_object('text', :text || i), 'k-' || i, 'failed', 5,
                   :now, :now - (i * interval '1 millisecond'), :now, :now, 'permanent',
                   'webhook answered 400'
            FROM generate_series(1, :n) AS i""",
                   {"hook": HOOK, "other": OTHER, "text": TEXT, "now": now, "n": 2 * n})


def _reset(db: Database) -> None:
    with db.transaction() as tx:
        tx.execute("UPDATE delivery_queue SET status = 'failed', attempts = 5, "
                   "failure_reason = 'permanent'")


def _one_shot(replay: Replay, flt: ReplayFilter) -> int:
    """The whole window in one read, every chosen entry in one restart."""
    entries = replay.store.window(flt.since, flt.until, limit=10_000_000)
    chosen = [e.id for e in entries if e.status is DeliveryStatus.FAILED
              and replay.destination_of(e) == flt.destination]
    return replay.store.restart(DeliveryOutcome.REDRIVE, chosen)


def _measured(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, peak KiB of Python memory, seconds)."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        result = fn()
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak / 1024, elapsed


def run() -> list[Row]:
    with scratch_database() as db:
        settings = Settings.from_env({
            "SLUICE_DATABASE_URL": db.conninfo,
            "SLUICE_WEBHOOK_SIGNING_SECRET": "bench-replay-webhook-secret-0123456789"})
        services = Services(settings, db, Reporter())
        _fill(db, ENTRIES)
        flt = ReplayFilter("webhook:127.0.0.1:9", utcnow() - timedelta(hours=1), utcnow())
        with Outbound.open(settings) as client:
            replay = Replay.from_services(services, client)
            _measured(lambda: replay.run(flt, dry_run=True))  # warm the caches and the plans
            report, ours_kib, ours_s = _measured(lambda: replay.run(flt, dry_run=False))
            assert report.count == ENTRIES, report
            _reset(db)
            count, theirs_kib, theirs_s = _measured(lambda: _one_shot(replay, flt))
            assert count == ENTRIES
    window = 2 * ENTRIES
    note = (f"{window:,} failed entries in the window, {ENTRIES:,} of the destination; Sluice "
            f"{report.pages} reads and {report.batches} restarts of at most {BATCH} entries, "
            "one-shot 1 read and 1 restart")
    return [
        row("replay: peak Python memory, paged vs one read of the window", ours_kib,
            theirs_kib, "KiB", False, note=note),
        row("replay: entries made due a second, paged vs one read", ENTRIES / ours_s,
            ENTRIES / theirs_s, "entries/s", True, note="same adapters, same restart statement"),
    ]
