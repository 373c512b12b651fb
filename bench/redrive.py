"""ledger-redrive: Sluice's scripted batches versus the best hand-written redrive, same run.

End to end (claim, Postgres insert with the outbox row, acknowledge) over redis-py
on SLUICE_BENCH_REDRIVE_ENTRIES entries (default 5,000), fenced as in a run, against
two references on the same Redis, the same tables, the same batch size and the same
durability (one commit a batch):

- the strong one (the main row): per batch of 100, one Lua claim (LMOVE queue ->
  processing), one statement inserting the ledger rows and their outbox rows (tombstoned
  users left out, the outbox row computed in SQL from the entry as parsed by
  ``json.loads``, nothing else checked), one Lua settle (LREM each);
- the naive one (what a straightforward port does): LMOVE one entry, INSERT it in its
  own transaction, LREM it.

Over Upstash REST (the local stand-in in front of the same Redis) on a fifth of the
entries against the naive loop. Then the reclaim pass over SLUICE_BENCH_RECLAIM_ENTRIES
stranded entries (default 10,000) versus a per-entry LMOVE loop.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any

from bench.common import Row, row, scratch_database
from sluice.billing.ledger_redrive import DEFAULT_REDRIVE_BATCH_SIZE, reclaim, redrive
from sluice.billing.usage import RetryEnvelope, UsageEntry, insert_entries
from sluice.jobs.registry import Deadline
from sluice.jobs.runs import Fence, RunStore, lease_holder_id
from sluice.store.db import PostgresDatabase, utcnow
from sluice.store.redis_clients import (
    LEDGER_RETRY_PROCESSING,
    LEDGER_RETRY_QUEUE,
    RedisClient,
    RedisPyClient,
    UpstashClient,
)

REDIS_URL = os.environ.get("SLUICE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ENTRIES = int(os.environ.get("SLUICE_BENCH_REDRIVE_ENTRIES", "5000"))
RECLAIM = int(os.environ.get("SLUICE_BENCH_RECLAIM_ENTRIES", "10000"))
ROUNDS = int(os.environ.get("SLUICE_BENCH_REDRIVE_ROUNDS", "5"))


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


# --- The strong reference: three round trips a batch, nothing but the work itself ---
# Written out here on purpose, not imported from sluice.billing.ledger_redrive: the claim is
# the same LMOVE loop as Sluice's, but a change to Sluice's scripts must not move the
# reference it is measured against.

REF_CLAIM = """
local claimed = {}
for i = 1, tonumber(ARGV[1]) do
  local item = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
  if not item then break end
  claimed[i] = item
end
return claimed
"""
REF_SETTLE = """
for i = 1, #ARGV do redis.call('LREM', KEYS[1], 1, ARGV[i]) end
return #ARGV
"""
REF_INSERT = """
WITH batch AS (
    SELECT * FROM jsonb_to_recordset(%s) AS r(
        id text, "tenantId" text, "userId" text, model text, "inputTokens" integer,
        "outputTokens" integer, "costMicros" bigint, "occurredAt" timestamptz)
    WHERE NOT EXISTS (SELECT 1 FROM erasure_tombstones t WHERE t.subject_user_id = r."userId")
), ledger AS (
    INSERT INTO ai_usage_ledger
        (id, tenant_id, user_id, model, input_tokens, output_tokens, cost_micros, occurred_at)
    SELECT id, "tenantId", "userId", model, "inputTokens", "outputTokens", "costMicros",
           "occurredAt"
    FROM batch
    ON CONFLICT (id) DO NOTHING
    RETURNING id, coalesce(tenant_id, user_id) AS customer, model, input_tokens,
              output_tokens, cost_micros
)
INSERT INTO ai_usage_metering_outbox (id, ledger_id, external_customer_id, event_name, metadata)
SELECT id || ':metering', id, customer, 'ai_usage',
       jsonb_build_object('model', model, 'input_tokens', input_tokens,
                          'output_tokens', output_tokens,
                          'total_tokens', input_tokens + output_tokens,
                          'cost_micros', cost_micros, 'ledger_id', id)
FROM ledger
WHERE customer IS NOT NULL AND (input_tokens > 0 OR output_tokens > 0 OR cost_micros > 0)
  AND NOT EXISTS (SELECT 1 FROM erasure_tombstones t WHERE t.subject_user_id = customer)
ON CONFLICT (id) DO NOTHING
"""


def strong_redrive(redis: RedisClient, conn: Any, batch_size: int) -> int:
    from psycopg.types.json import Jsonb

    done = 0
    while claimed := redis.eval(REF_CLAIM, [LEDGER_RETRY_QUEUE, LEDGER_RETRY_PROCESSING],
                                [batch_size]):
        conn.execute(REF_INSERT, (Jsonb([json.loads(raw)["entry"] for raw in claimed]),),
                     prepare=True)
        redis.eval(REF_SETTLE, [LEDGER_RETRY_PROCESSING], claimed)
        done += len(claimed)
    return done


def naive_redrive(redis: RedisClient, db: PostgresDatabase) -> int:
    done = 0
    while (raw := redis.lmove(LEDGER_RETRY_QUEUE, LEDGER_RETRY_PROCESSING)) is not None:
        envelope = RetryEnvelope.parse(raw)
        insert_entries(db, [UsageEntry.from_contract(envelope.entry)])
        redis.lrem(LEDGER_RETRY_PROCESSING, 1, raw)
        done += 1
    return done


def _outbox_rows(db: PostgresDatabase) -> int:
    with db.transaction() as tx:
        count = tx.fetchone("SELECT count(*) AS n FROM ai_usage_metering_outbox")
    assert count is not None
    return int(count["n"])


def _sluice_rate(redis: RedisClient, db: PostgresDatabase, items: list[str],
                 fence: Fence | None) -> float:
    _fill(redis, LEDGER_RETRY_QUEUE, items)
    _reset(db)
    started = time.perf_counter()
    result = redrive(redis, db, now=utcnow(), deadline=Deadline(3600),
                     max_batches=len(items) // DEFAULT_REDRIVE_BATCH_SIZE + 1, fence=fence)
    elapsed = time.perf_counter() - started
    assert result["succeeded"] == len(items), result
    assert _outbox_rows(db) == len(items)
    return len(items) / elapsed


def _strong_rate(redis: RedisClient, db: PostgresDatabase, conn: Any, items: list[str]) -> float:
    _fill(redis, LEDGER_RETRY_QUEUE, items)
    _reset(db)
    started = time.perf_counter()
    assert strong_redrive(redis, conn, DEFAULT_REDRIVE_BATCH_SIZE) == len(items)
    elapsed = time.perf_counter() - started
    assert _outbox_rows(db) == len(items)
    assert redis.llen(LEDGER_RETRY_PROCESSING) == 0
    return len(items) / elapsed


def _naive_rate(redis: RedisClient, db: PostgresDatabase, items: list[str]) -> float:
    _fill(redis, LEDGER_RETRY_QUEUE, items)
    _reset(db)
    started = time.perf_counter()
    assert naive_redrive(redis, db) == len(items)
    elapsed = time.perf_counter() - started
    assert _outbox_rows(db) == len(items)
    return len(items) / elapsed


def _end_to_end(redis: RedisClient, db: PostgresDatabase, n: int) -> tuple[float, float, float]:
    """Entries/s of Sluice (fenced as in a run), the strong reference and the naive loop;
    Sluice and the strong reference in interleaved rounds, medians."""
    import psycopg

    items = _items(n)
    holder = lease_holder_id()
    assert RunStore(db).acquire_lease("ledger-redrive", holder, timedelta(hours=1))
    fence = Fence("ledger-redrive", holder)
    sluice, strong = [], []
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        for n_round in range(ROUNDS + 1):  # the first round warms up
            # The order alternates, so neither side always meets the fuller tables.
            if n_round % 2:
                theirs = _strong_rate(redis, db, conn, items)
                ours = _sluice_rate(redis, db, items, fence)
            else:
                ours = _sluice_rate(redis, db, items, fence)
                theirs = _strong_rate(redis, db, conn, items)
            if n_round:
                sluice.append(ours)
                strong.append(theirs)
    return statistics.median(sluice), statistics.median(strong), _naive_rate(redis, db, items)


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
            sluice, strong, naive = _end_to_end(tcp, db, ENTRIES)
            rows.append(row("redrive: end to end, redis-py, vs the strong reference", sluice,
                            strong, "entries/s", True,
                            note=f"{ENTRIES:,} entries, batches of {DEFAULT_REDRIVE_BATCH_SIZE}, "
                                 "fenced; reference = Lua claim + one INSERT statement (ledger + "
                                 "outbox, tombstones) + Lua settle a batch, no check of the "
                                 "envelopes or entries and no fence; median of "
                                 f"{ROUNDS} interleaved rounds, the order alternating"))
            rows.append(row("redrive: end to end, redis-py, vs a naive loop", sluice, naive,
                            "entries/s", True,
                            note="naive = LMOVE/INSERT/LREM per entry, one transaction each"))
            small = max(DEFAULT_REDRIVE_BATCH_SIZE, ENTRIES // 5)
            sluice = _sluice_rate(rest, db, _items(small), None)
            naive = _naive_rate(rest, db, _items(small))
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
