"""Completed idempotency keys, in-process dead letters and flags: one contract, both backends."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sluice.queues.deadletters import LocalDeadLetters
from sluice.queues.keys import CompletedKeys, RedisCompletedKeys
from sluice.store.db import Database, utcnow
from sluice.store.flags import FlagStore
from sluice.store.redis_clients import RedisClient
from sluice.store.state import StateStore


def test_completed_keys_expire_after_the_retention(db: Database) -> None:
    keys = CompletedKeys(db, retention=timedelta(hours=1))
    now = utcnow()
    assert not keys.done("rss.ingest:b:x", now=now)
    keys.complete("rss.ingest:b:x", "rss.ingest", "m-1", now=now)
    assert keys.done("rss.ingest:b:x", now=now + timedelta(minutes=59))
    assert not keys.done("rss.ingest:b:x", now=now + timedelta(minutes=61))
    keys.complete("rss.ingest:b:x", "rss.ingest", "m-2", now=now + timedelta(minutes=30))
    assert keys.done("rss.ingest:b:x", now=now + timedelta(minutes=80))
    keys.complete("rss.ingest:b:y", "rss.ingest", "m-3", now=now - timedelta(hours=2))
    assert keys.delete_expired(now=now) == 1


def test_each_write_retires_expired_keys(db: Database) -> None:
    keys = CompletedKeys(db, retention=timedelta(hours=1))
    now = utcnow()
    keys.complete_many([(f"old:{i}", "rss.ingest", f"m{i}") for i in range(150)],
                       now=now - timedelta(hours=2))
    keys.complete("new:1", "rss.ingest", "n1", now=now)
    assert keys.delete_expired(now=now, limit=1000) == 50, "the write retired 100 of 150"
    keys.complete("new:2", "rss.ingest", "n2", now=now)
    assert keys.done_many(["new:1", "new:2"], now=now) == {"new:1", "new:2"}


def test_completed_keys_in_bulk(db: Database) -> None:
    keys = CompletedKeys(db, retention=timedelta(hours=1))
    now = utcnow()
    keys.complete_many([("k:1", "rss.ingest", "m1"), ("k'2", "rss.ingest", "m2")], now=now)
    keys.complete("k:old", "rss.ingest", "m0", now=now - timedelta(hours=2))
    assert keys.done_many(["k:1", "k'2", "k:3", "k:old"], now=now) == {"k:1", "k'2"}
    assert keys.done_many([], now=now) == set()


def test_local_dead_letters_newest_first(db: Database) -> None:
    letters = LocalDeadLetters(db)
    first = letters.add("rss.ingest", {"failedAt": "1", "originalMessage": {"a": "é"}})
    second = letters.add("rss.ingest", {"failedAt": "2", "originalMessage": {}})
    letters.add("rss.enrich", {"failedAt": "3"})
    assert [r["id"] for r in letters.list("rss.ingest", 10)] == [second, first]
    assert letters.get("rss.ingest", first)["summary"]["originalMessage"] == {"a": "é"}
    assert letters.count("rss.ingest") == 2
    assert letters.delete("rss.ingest", first) and not letters.delete("rss.ingest", first)
    assert letters.purge("rss.ingest") == 1 and letters.count("rss.enrich") == 1


def test_flag_overrides_win_over_the_global_value(db: Database) -> None:
    flags = FlagStore(StateStore(db))
    assert flags.enabled("rssQueuePipeline") is False
    assert flags.enabled("rssQueuePipeline", "t-1") is False
    flags.set("rssQueuePipeline", True, "t-1")
    assert flags.enabled("rssQueuePipeline", "t-1") is True
    assert flags.enabled("rssQueuePipeline") is False
    flags.set("rssQueuePipeline", True)
    flags.set("rssQueuePipeline", False, "t_2")  # LIKE wildcards in ids are literal
    assert flags.overrides("rssQueuePipeline") == {"t-1": True, "t_2": False}
    assert flags.enabled("rssQueuePipeline", "t_2") is False
    assert flags.enabled("rssQueuePipeline", "t-3") is True
    assert flags.clear_override("rssQueuePipeline", "t-1")
    assert flags.overrides("rssQueuePipeline") == {"t_2": False}


@pytest.mark.redis
def test_completed_keys_in_redis(redis_client: RedisClient) -> None:
    """Both transports (redis-py over TCP, upstash-redis over REST)."""
    keys = RedisCompletedKeys(redis_client, retention=timedelta(hours=1))
    assert not keys.done("rss.ingest:b:x") and keys.done_many([]) == set()
    keys.complete("rss.ingest:b:x", "rss.ingest", "m-1")
    keys.complete_many([("k:1", "rss.ingest", "m1"), ("k'2", "rss.ingest", "m2")])
    assert keys.done("rss.ingest:b:x")
    assert keys.done_many(["k:1", "nope", "k'2"]) == {"k:1", "k'2"}
    value, ttl = redis_client.eval("return {redis.call('GET', KEYS[1]), redis.call('TTL', KEYS[1])}",
                                   ["queue:completed:k:1"], [])
    assert value == "rss.ingest m1" and 3500 < int(ttl) <= 3600
