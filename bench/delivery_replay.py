"""A replay reads its window a page at a time, and only its key's entries
(``python -m bench delivery``).

On Postgres, ``SLUICE_BENCH_REPLAY_ENTRIES`` failed entries (default 20,000) of one webhook
destination and as many of another are in the window. Sluice's replay
(``sluice.delivery.replay``: 500 entries of the key a read, each page's chosen entries
restarted in one statement) against the one-shot way (one read of the key's whole window,
one restart of every chosen entry), both through the same store and the same restart
statement. Rows: the peak of Python memory while each runs (``tracemalloc``; lower is
better) and entries made due a second; notes give the statements each ran.

Then 50 failed entries of one URL among ``SLUICE_BENCH_REPLAY_AMONG`` (default 100,000)
failed entries in the same window (the others of 1,000 chats): the replay by the key's own index
against the way before it (every destination's entries of the window read 500 a page, by
the window index of all destinations, and matched in Python). Row: seconds to replay the
50; note: pages each read.
"""

from __future__ import annotations

import os
import time
import tracemalloc
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from bench.common import Row, row, scratch_database
from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.delivery.channels import Outbound
from sluice.delivery.policy import DeliveryOutcome
from sluice.delivery.replay import BATCH, Replay, ReplayFilter
from sluice.delivery.store import DeliveryEntry, DeliveryStatus
from sluice.store.db import Database, utcnow

ENTRIES = int(os.environ.get("SLUICE_BENCH_REPLAY_ENTRIES", "20000"))
AMONG = int(os.environ.get("SLUICE_BENCH_REPLAY_AMONG", "100000"))
HOOK = "http://127.0.0.1:9/hooks/replayed"
OTHER = "http://127.0.0.1:10/hooks/other"
TEXT = "an alert of a few hundred characters, " * 6
# The replay's window read before it selected by key: every destination's settled entries
# of the window, a page at a time, by an index of all of them (0026's, made here for it).
WINDOW_INDEX = ("CREATE INDEX IF NOT EXISTS bench_window_idx ON delivery_queue "
                "(enqueued_at, id) WHERE status IN ('acked', 'failed', 'unknown')")
WINDOW_PAGE = """
SELECT * FROM delivery_queue
WHERE status IN ('acked', 'failed', 'unknown')
  AND (enqueued_at, id) > (:after_at, :after_id) AND enqueued_at < :until
ORDER BY enqueued_at, id
LIMIT :limit
"""


def _fill(db: Database, n: int) -> None:
    now = utcnow()
    with db.transaction() as tx:
        tx.execute("""
            INSERT INTO delivery_queue (id, channel, recipient, payload, idempotency_key,
                status, attempts, next_attempt_at, enqueued_at, updated_at, failed_at,
                failure_reason, last_error, destination, receiver)
            SELECT 'e-' || i, 'webhook', u.url, jsonb_build_object('text', :text || i),
                   'k-' || i, 'failed', 5, :now, :now - (i * interval '1 millisecond'), :now,
                   :now, 'permanent', 'webhook answered 400', 'webhook:' || u.url,
                   'webhook:127.0.0.1:' || u.port
            FROM generate_series(1, :n) AS i,
                 LATERAL (SELECT CASE WHEN i % 2 = 0 THEN :hook ELSE :other END AS url,
                                 CASE WHEN i % 2 = 0 THEN 9 ELSE 10 END AS port) u""",
                   {"hook": HOOK, "other": OTHER, "text": TEXT, "now": now, "n": 2 * n})


def _fill_among(db: Database, n: int) -> None:
    """``n`` failed entries in the window: 50 of ``HOOK``, spread over it, the others of
    1,000 chats."""
    now = utcnow()
    with db.transaction() as tx:
        tx.execute("""
            INSERT INTO delivery_queue (id, channel, recipient, payload, status, attempts,
                next_attempt_at, enqueued_at, updated_at, failed_at, failure_reason,
                destination, receiver)
            SELECT 'a-' || i, c.channel, c.recipient, jsonb_build_object('text', CAST(:text AS text)),
                   'failed', 5, :now, :now - (i * interval '10 millisecond'), :now, :now,
                   'permanent', c.channel || ':' || c.recipient,
                   CASE WHEN c.channel = 'webhook' THEN 'webhook:127.0.0.1:9'
                        ELSE c.channel || ':' || c.recipient END
            FROM generate_series(1, CAST(:n AS integer)) AS i,
                 LATERAL (SELECT CASE WHEN i % CAST(:every AS integer) = 0 THEN 'webhook'
                                      ELSE 'telegram' END AS channel,
                                 CASE WHEN i % CAST(:every AS integer) = 0
                                      THEN CAST(:hook AS text)
                                      ELSE CAST(100000 + i % 1000 AS text) END
                                     AS recipient) c""",
                   {"hook": HOOK, "text": TEXT, "now": now, "n": n, "every": n // 50})
        tx.execute(WINDOW_INDEX)
        tx.execute("ANALYZE delivery_queue")


def _reset(db: Database) -> None:
    with db.transaction() as tx:
        tx.execute("UPDATE delivery_queue SET status = 'failed', attempts = 5, "
                   "failure_reason = 'permanent'")


def _one_shot(replay: Replay, flt: ReplayFilter) -> int:
    """The key's whole window in one read, every chosen entry in one restart."""
    entries = replay.store.window(flt.destination, flt.since, flt.until, limit=10_000_000)
    chosen = [e.id for e in entries if e.status is DeliveryStatus.FAILED]
    return replay.store.restart(DeliveryOutcome.REDRIVE, chosen)


def _every_destination(db: Database, replay: Replay, flt: ReplayFilter) -> tuple[int, int]:
    """The replay as it read its window before: every entry of it, matched in Python;
    (entries restarted, pages read)."""
    count, pages, after = 0, 0, (flt.since, "")
    while True:
        with db.transaction() as tx:
            rows = tx.fetchall(WINDOW_PAGE, {"after_at": after[0], "after_id": after[1],
                                             "until": flt.until, "limit": BATCH})
        page = [DeliveryEntry.from_row(r) for r in rows]
        pages += 1
        chosen = [e.id for e in page if flt.destination in (e.destination, e.receiver)
                  and e.status is DeliveryStatus.FAILED]
        count += replay.store.restart(DeliveryOutcome.REDRIVE, chosen)
        if len(page) < BATCH:
            return count, pages
        after = (page[-1].enqueued_at, page[-1].id)


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


def _window(destination: str, now: datetime) -> ReplayFilter:
    return ReplayFilter(destination, now - timedelta(hours=1), now)


def run() -> list[Row]:
    settings_env = {"SLUICE_WEBHOOK_SIGNING_SECRET": "bench-replay-webhook-secret-0123456789",
                    "SLUICE_TELEGRAM_BOT_TOKEN": "1:bench"}
    with scratch_database() as db:
        settings = Settings.from_env({"SLUICE_DATABASE_URL": db.conninfo, **settings_env})
        services = Services(settings, db, Reporter())
        _fill(db, ENTRIES)
        flt = _window("webhook:127.0.0.1:9", utcnow())
        with Outbound.open(settings) as client:
            replay = Replay.from_services(services, client)
            _measured(lambda: replay.run(flt, dry_run=True))  # warm the caches and the plans
            report, ours_kib, ours_s = _measured(lambda: replay.run(flt, dry_run=False))
            assert report.count == ENTRIES, report
            _reset(db)
            count, theirs_kib, theirs_s = _measured(lambda: _one_shot(replay, flt))
            assert count == ENTRIES
    with scratch_database() as db:
        settings = Settings.from_env({"SLUICE_DATABASE_URL": db.conninfo, **settings_env})
        _fill_among(db, AMONG)
        among = _window(f"webhook:{HOOK}", utcnow())
        with Outbound.open(settings) as client:
            replay = Replay.from_services(Services(settings, db, Reporter()), client)
            keyed = replay.run(among, dry_run=True)  # warm the plans
            started = time.perf_counter()
            keyed = replay.run(among, dry_run=False)
            keyed_s = time.perf_counter() - started
            assert keyed.count == 50, keyed
            _reset(db)
            started = time.perf_counter()
            every, every_pages = _every_destination(db, replay, among)
            every_s = time.perf_counter() - started
            assert every == 50
    window = 2 * ENTRIES
    note = (f"{window:,} failed entries in the window, {ENTRIES:,} of the destination; Sluice "
            f"{report.pages} reads and {report.batches} restarts of at most {BATCH} entries, "
            "one-shot 1 read and 1 restart")
    return [
        row("replay: peak Python memory, paged vs one read of the window", ours_kib,
            theirs_kib, "KiB", False, note=note),
        row("replay: entries made due a second, paged vs one read", ENTRIES / ours_s,
            ENTRIES / theirs_s, "entries/s", True, note="same store, same restart statement"),
        row(f"replay: 50 entries among {AMONG:,} in the window, by key vs every destination's",
            keyed_s, every_s, "s", False,
            note=f"pages read: {keyed.pages} by key, {every_pages} of every destination"),
    ]


if __name__ == "__main__":
    for result in run():
        print(result)


__all__: list[Any] = ["run"]
