"""The destinations view at 1,000 and 100,000 destinations (``python -m bench delivery``).

Each destination has two entries (one acked, one failed; a fifth of them also one
pending): most are chats (``telegram:<n>``), one in ten a webhook URL on one of 100 hosts
(its receiver is the host). One destination in ten holds a state row: a failing one, a
paused one, a disabled one or only a last success. The figure is the median of ``REPEAT``
requests of ``GET /api/admin/delivery/destinations`` (its first page) and of the same with
``?state=failing``, through one in-process client with an admin token, on SQLite and on
Postgres; the baseline is the same request at 1,000 destinations, so a ratio of 1.0 is
flat and 0.01 a hundred times slower (what a view that reads every destination would be).
"""

from __future__ import annotations

import os
from typing import Any

from bench.common import Row, admin_client, admin_headers, median_requests, row, scratch_store

SIZES = tuple(int(n) for n in os.environ.get("SLUICE_BENCH_DESTINATIONS_SIZES",
                                               "1000,100000").split(","))
REPEAT = int(os.environ.get("SLUICE_BENCH_DESTINATIONS_REPEAT", "7"))
PATHS = ("/api/admin/delivery/destinations", "/api/admin/delivery/destinations?state=failing")

# n: the destination's number; its recipient, keys and two (or three) entries
ENTRIES = """
INSERT INTO delivery_queue (id, channel, recipient, payload, status, attempts,
    next_attempt_at, enqueued_at, updated_at, acked_at, failed_at, failure_reason,
    destination, receiver)
SELECT 'e' || n || '-' || k, d.channel, d.recipient, '{"text": "bench"}',
       CASE k WHEN 0 THEN 'acked' WHEN 1 THEN 'failed' ELSE 'pending' END, 1,
       :now, :now, :now, CASE k WHEN 0 THEN :now END, CASE k WHEN 1 THEN :now END,
       CASE k WHEN 1 THEN 'permanent' END,
       d.channel || ':' || d.recipient,
       CASE WHEN d.channel = 'webhook' THEN 'webhook:h' || (n % 100) || '.example:443'
            ELSE d.channel || ':' || d.recipient END
FROM (SELECT n, CASE WHEN n % 10 = 0 THEN 'webhook' ELSE 'telegram' END AS channel,
             CASE WHEN n % 10 = 0 THEN 'https://h' || (n % 100) || '.example/hook/' || n
                  ELSE CAST(100000000 + n AS text) END AS recipient
      FROM seq) d
CROSS JOIN (SELECT 0 AS k UNION ALL SELECT 1 UNION ALL SELECT 2) kinds
WHERE k < 2 OR n % 5 = 0
"""
STATES = """
INSERT INTO delivery_destinations (key, failures, down_since, next_probe_at, last_error,
    paused_until, paused_at, disabled_at, disabled_reason, last_success_at, updated_at)
SELECT 'telegram:' || CAST(100000000 + n AS text), CASE WHEN n % 40 = 1 THEN 3 ELSE 0 END,
       CASE WHEN n % 40 = 1 THEN :now END, CASE WHEN n % 40 = 1 THEN :later END,
       CASE WHEN n % 40 = 1 THEN 'connection refused' END,
       CASE WHEN n % 40 = 11 THEN :later END, CASE WHEN n % 40 = 11 THEN :now END,
       CASE WHEN n % 40 = 21 THEN :now END, CASE WHEN n % 40 = 21 THEN 'gone: 410' END,
       :now, :now
FROM seq WHERE n % 10 = 1
"""
SEQ = {"postgres": "WITH seq(n) AS (SELECT generate_series(CAST(:start AS integer), "
                   "CAST(:stop AS integer) - 1)) ",
       "sqlite": "WITH RECURSIVE seq(n) AS (SELECT :start UNION ALL SELECT n + 1 FROM seq "
                 "WHERE n + 1 < :stop) "}


def _seed(db: Any, start: int, stop: int) -> None:
    from datetime import timedelta

    from sluice.store.db import utcnow

    now = utcnow()
    params = {"start": start, "stop": stop, "now": now, "later": now + timedelta(days=1)}
    with db.transaction() as tx:
        for statement in (ENTRIES, STATES):  # INSERT INTO ... WITH seq ... SELECT ...
            head, _, tail = statement.strip().partition("SELECT")
            tx.execute(f"{head}{SEQ[db.dialect]}SELECT{tail}", params)
    with db.transaction() as tx:
        tx.execute("ANALYZE")


def _latencies(url: str, db: Any) -> tuple[dict[tuple[str, int], float], dict[str, int]]:
    headers = admin_headers()
    found: dict[tuple[str, int], float] = {}
    shown: dict[str, int] = {}
    seeded = 0
    with admin_client(url, SLUICE_TELEGRAM_BOT_TOKEN="1:bench") as client:
        for size in SIZES:
            _seed(db, seeded, size)
            seeded = size
            medians, last = median_requests(client, PATHS, headers, REPEAT)
            for path in PATHS:
                found[(path, size)] = medians[path]
                shown[path] = len(last[path]["destinations"])
    return found, shown


def _rows(backend: str, found: dict[tuple[str, int], float], shown: dict[str, int]
          ) -> list[Row]:
    rows = []
    for path in PATHS:
        base = found[(path, SIZES[0])]
        for size in SIZES[1:]:
            rows.append(row(f"delivery: GET {path.removeprefix('/api/admin/delivery/')}, "
                            f"{backend}, {size:,} vs {SIZES[0]:,} destinations",
                            found[(path, size)], base, "ms", False,
                            note=f"median of {REPEAT}; {shown[path]} shown (a page); "
                                 "ratio 1.0 = flat with the destinations known"))
    return rows


def run() -> list[Row]:
    rows: list[Row] = []
    for backend, dialect in (("SQLite", "sqlite"), ("Postgres", "postgres")):
        with scratch_store(dialect) as (db, url):
            rows.extend(_rows(backend, *_latencies(url, db)))
    return rows


if __name__ == "__main__":
    for result in run():
        print(result)


__all__: list[Any] = ["run"]
