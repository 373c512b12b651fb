"""Fixtures of the integration tier: both Redis transports and the Polar stand-in.

``redis_client`` (and ``redis_env``) run a test once over redis-py (TCP) and once over
upstash-redis (REST, through the local Upstash stand-in), both against the real Redis.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluice.core.settings import Settings
from sluice.store.redis_clients import RedisClient, RedisPyClient, UpstashClient, connect
from tests.providers.polar import PolarStandIn
from tests.providers.upstash import UpstashRestServer


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
