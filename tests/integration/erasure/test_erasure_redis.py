"""The Redis sweep of the ledger retry lists, over redis-py and upstash-redis (REST)."""

from __future__ import annotations

import json

from shared.erasure.registry import LEDGER_RETRY_LISTS, RedisJsonLists
from shared.store.redis_clients import RedisClient
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
