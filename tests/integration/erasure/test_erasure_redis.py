"""The Redis sweep of the ledger retry lists, over redis-py and upstash-redis (REST)."""

from __future__ import annotations

import json

from sluice.erasure.registry import LEDGER_RETRY_LISTS, RedisJsonLists
from sluice.store.redis_clients import RedisClient
from tests.integration.billing.usage_fixtures import (  # noqa: F401 — fixtures, used by name
    redis_client,
    redis_env,
    transport,
    upstash_server,
)

STORE = RedisJsonLists("ledger-retry", LEDGER_RETRY_LISTS)


def _envelope(user: str | None, n: int) -> str:
    return json.dumps({"id": f"e{n}", "attempts": n, "enqueuedAt": 1, "lastError": "x",
                       "entry": {"id": f"l{n}", "tenantId": "t", "userId": user}})


def test_the_sweep_counts_then_removes_only_the_subjects_entries(
        redis_client: RedisClient) -> None:  # noqa: F811 — the imported fixture
    queue, processing, dlq = LEDGER_RETRY_LISTS
    mine = [_envelope("u1", 1), _envelope("u1", 2)]
    theirs = [_envelope("u10", 3), _envelope(None, 4), "not json", json.dumps([1, 2]),
              json.dumps({"userId": "u2"})]
    redis_client.rpush(queue, *mine, *theirs)
    redis_client.rpush(processing, mine[0], mine[0])  # a duplicate value: both go
    redis_client.rpush(dlq, json.dumps({"userId": "u1"}))  # flat shape, also the subject's

    expected = {f"redis:{queue}": 2, f"redis:{processing}": 2, f"redis:{dlq}": 1}
    assert STORE.count(redis_client, "u1") == expected
    assert redis_client.llen(queue) == 7, "counting removes nothing"

    assert STORE.purge(redis_client, "u1") == expected
    assert redis_client.lrange(queue, 0, -1) == theirs
    assert redis_client.llen(processing) == 0 and redis_client.llen(dlq) == 0
    assert STORE.purge(redis_client, "u1") == dict.fromkeys(expected, 0), "idempotent"


def test_no_redis_configured_means_nothing_to_sweep() -> None:
    assert STORE.count(None, "u1") == {} and STORE.purge(None, "u1") == {}


def test_dead_letters_of_any_shape_are_matched_or_reported_unmatchable(
        redis_client: RedisClient) -> None:  # noqa: F811 — the imported fixture
    from sluice.billing.usage import dead_letter
    from sluice.store.db import utcnow

    _, _, dlq = LEDGER_RETRY_LISTS
    wrapped = dead_letter(json.dumps([{"entry": {"userId": "42"}}]), "not an envelope", utcnow())
    raw_object = dead_letter("garbage", "x", utcnow()).replace('"garbage"', json.dumps(
        json.dumps({"entry": {"userId": 42}})))  # an object kept as text, numeric userId
    numeric = json.dumps({"id": "e9", "entry": {"id": "l9", "userId": 42}})
    mentions = dead_letter("user 42 broke this", "not json", utcnow())
    other = json.dumps({"entry": {"userId": 420}})
    redis_client.rpush(dlq, wrapped, raw_object, numeric, mentions, other)

    counted = STORE.count(redis_client, "42")
    assert counted[f"redis:{dlq}"] == 2, "numeric userId, also inside a kept raw text"
    assert counted[f"redis:{dlq}:unmatchable"] == 2, "no owner to read, but the id is there"
    STORE.purge(redis_client, "42")
    assert redis_client.lrange(dlq, 0, -1) == [wrapped, mentions, other]
    after = STORE.count(redis_client, "42")
    assert after == {f"redis:{q}": 0 for q in LEDGER_RETRY_LISTS} | {
        f"redis:{dlq}:unmatchable": 2}, "never counted as clean"
