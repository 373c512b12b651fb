"""Fixtures for the AI usage tests: both Redis transports, Polar, ledger entries.

Import them by name into a test module (``from tests.integration.usage_fixtures
import ...``); ``redis_client`` runs each test once over redis-py (TCP) and once
over upstash-redis (REST, through the local Upstash stand-in) against the real Redis.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.redis_client import RedisClient, RedisPyClient, UpstashClient, connect
from shared.settings import Settings
from shared.usage import RetryEnvelope, UsageEntry
from tests.providers.polar import PolarStandIn
from tests.providers.upstash import UpstashRestServer

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def entry(i: int, **changes: Any) -> UsageEntry:
    fields: dict[str, Any] = {"id": f"use-{i:05d}", "model": "gpt-4.1-mini",
                              "occurred_at": T0 + timedelta(seconds=i), "tenant_id": f"t{i % 3}",
                              "user_id": f"u{i}", "input_tokens": 100 + i, "output_tokens": 20,
                              "cost_micros": 1_000 + i}
    fields.update(changes)
    return UsageEntry(**fields)


def envelope(i: int, *, attempts: int = 0, **changes: Any) -> str:
    env = RetryEnvelope.for_entry(entry(i, **changes), last_error="store_unavailable: down",
                                  now=T0)
    data = json.loads(env.to_json())
    data["attempts"] = attempts
    return json.dumps(data, separators=(",", ":"))


@pytest.fixture(scope="session")
def upstash_server(redis_server: str) -> Iterator[UpstashRestServer]:
    with UpstashRestServer(redis_server) as server:
        yield server


@pytest.fixture(params=["redis-py", "upstash"])
def transport(request: pytest.FixtureRequest) -> str:
    param: str = request.param
    return param


@pytest.fixture
def redis_env(transport: str, redis_server: str, redis_prefix: str,
              request: pytest.FixtureRequest) -> dict[str, str]:
    """The environment that points Sluice at the real Redis over ``transport``."""
    if transport == "redis-py":
        return {"SLUICE_REDIS_URL": redis_server, "SLUICE_REDIS_KEY_PREFIX": redis_prefix}
    server: UpstashRestServer = request.getfixturevalue("upstash_server")
    return {"UPSTASH_REDIS_REST_URL": server.url, "UPSTASH_REDIS_REST_TOKEN": server.token,
            "SLUICE_REDIS_KEY_PREFIX": redis_prefix}


@pytest.fixture
def redis_client(redis_env: dict[str, str]) -> Iterator[RedisClient]:
    client = connect(Settings.from_env(redis_env))
    assert isinstance(client, (RedisPyClient, UpstashClient))
    yield client
    client.close()


@pytest.fixture
def polar() -> Iterator[PolarStandIn]:
    with PolarStandIn() as server:
        yield server
