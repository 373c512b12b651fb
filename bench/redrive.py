"""ledger-redrive: Sluice's scripted batches versus a naive per-entry loop, same run.

End to end (claim, Postgres insert with the outbox row, acknowledge) over redis-py
on SLUICE_BENCH_REDRIVE_ENTRIES entries (default 5,000), and over Upstash REST (the
local stand-in in front of the same Redis) on a fifth of them. The naive loop is
what a straightforward port does: LMOVE one entry, INSERT it in its own
transaction, LREM it. Then the reclaim pass over SLUICE_BENCH_RECLAIM_ENTRIES
stranded entries (default 10,000) versus a per-entry LMOVE loop.
"""

from __future__ import annotations

import os
import time
import uuid

from bench.common import Row, row, scratch_database
from shared.billing.ledger_redrive import DEFAULT_REDRIVE_BATCH_SIZE, reclaim, redrive
from shared.billing.usage import RetryEnvelope, UsageEntry, insert_entries
from shared.jobs.registry import Deadline
from shared.store.db import PostgresDatabase, utcnow
from shared.store.redis_clients import (
    LEDGER_RETRY_PROCESSING,
    LEDGER_RETRY_QUEUE,
    RedisClient,
    RedisPyClient,
    UpstashClient,
)

REDIS_URL = os.environ.get("SLUICE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ENTRIES = int(os.environ.get("SLUICE_BENCH_REDRIVE_ENTRIES", "5000"))
RECLAIM = int(os.environ.get("SLUICE_BENCH_RECLAIM_ENTRIES", "10000"))


def _items(n: int) -> list[str]:
    now = utcnow()
    return [RetryEnvelope.for_entry(
        UsageEntry(id=f"bench-{i}", model="gpt-4.1-mini", occurred_at=now, tenant_id=f"t{i % 50}",
                   user_id=f"u{i}", input_tokens=100, output_tokens=20, cost_micros=900),
        last_error="store_unavailable: bench", now=now).to_json() for i in range(n)]


def _fill(redis: RedisClient, name: str, items: list[str]) -> None:
    redis.delete(name)
    for start in range(0, len(items), 1000):
        redis.lpush(name, *items[start:start + 1000])


def _reset(db: PostgresDatabase) -> None:
    with db.transaction() as tx:
        tx.execute("TRUNCATE ai_usage_ledger, ai_usage_metering_outbox")


def naive_redrive(redis: RedisClient, db: PostgresDatabase) -> int:
    done = 0
    while (raw := redis.lmove(LEDGER_RETRY_QUEUE, LEDGER_RETRY_PROCESSING)) is not None:
        envelope = RetryEnvelope.parse(raw)
        insert_entries(db, [UsageEntry.from_contract(envelope.entry)])
        redis.lrem(LEDGER_RETRY_PROCESSING, 1, raw)
        done += 1
    return done


def _end_to_end(redis: RedisClient, db: PostgresDatabase, n: int) -> tuple[float, float]:
    items = _items(n)
    _fill(redis, LEDGER_RETRY_QUEUE, items)
    _reset(db)
    started = time.perf_counter()
    result = redrive(redis, db, now=utcnow(), deadline=Deadline(3600),
                     max_batches=n // DEFAULT_REDRIVE_BATCH_SIZE + 1)
    sluice_s = time.perf_counter() - started
    assert result["succeeded"] == n, result

    _fill(redis, LEDGER_RETRY_QUEUE, items)
    _reset(db)
    started = time.perf_counter()
    assert naive_redrive(redis, db) == n
    naive_s = time.perf_counter() - started
    with db.transaction() as tx:
        count = tx.fetchone("SELECT count(*) AS n FROM ai_usage_metering_outbox")
    assert count is not None and count["n"] == n
    return n / sluice_s, n / naive_s


def _reclaim(redis: RedisClient, n: int) -> tuple[float, float]:
    items = _items(n)
    _fill(redis, LEDGER_RETRY_PROCESSING, items)
    redis.delete(LEDGER_RETRY_QUEUE)
    started = time.perf_counter()
    assert reclaim(redis) == n
    sluice_s = time.perf_counter() - started

    _fill(redis, LEDGER_RETRY_PROCESSING, items)
    redis.delete(LEDGER_RETRY_QUEUE)
    started = time.perf_counter()
    moved = 0
    while redis.lmove(LEDGER_RETRY_PROCESSING, LEDGER_RETRY_QUEUE, "LEFT", "RIGHT") is not None:
        moved += 1
    naive_s = time.perf_counter() - started
    assert moved == n
    return n / sluice_s, n / naive_s


def run() -> list[Row]:
    import redis as redis_py

    from tests.providers.upstash import UpstashRestServer

    prefix = f"sluice-bench:{uuid.uuid4().hex[:8]}:"
    tcp = RedisPyClient(redis_py.Redis.from_url(REDIS_URL, decode_responses=True), prefix)
    rows: list[Row] = []
    try:
        with scratch_database() as db, UpstashRestServer(REDIS_URL) as server:
            rest = UpstashClient.from_url(server.url, server.token, prefix)
            sluice, naive = _end_to_end(tcp, db, ENTRIES)
            rows.append(row("redrive: end to end, redis-py", sluice, naive, "entries/s", True,
                            note=f"{ENTRIES:,} entries, Postgres insert + outbox row, "
                                 "naive = LMOVE/INSERT/LREM per entry"))
            small = max(DEFAULT_REDRIVE_BATCH_SIZE, ENTRIES // 5)
            sluice, naive = _end_to_end(rest, db, small)
            rows.append(row("redrive: end to end, Upstash REST", sluice, naive, "entries/s", True,
                            note=f"{small:,} entries via the local REST stand-in"))
            sluice, naive = _reclaim(tcp, RECLAIM)
            rows.append(row("redrive: reclaim pass, redis-py", sluice, naive, "entries/s", True,
                            note=f"{RECLAIM:,} stranded entries, naive = LMOVE per entry"))
            rest.close()
    finally:
        tcp.delete(LEDGER_RETRY_QUEUE, LEDGER_RETRY_PROCESSING, "ai:ledger:retry:dlq")
        tcp.close()
    return rows
