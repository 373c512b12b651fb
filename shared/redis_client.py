"""Redis behind one small Protocol: redis-py over TCP, or upstash-redis over REST.

Keys are given without the settings' key prefix; the client adds it. Only the
commands Sluice uses are here, so both transports can be checked by one
contract suite against the real Redis.
"""

from __future__ import annotations

from typing import Any, Protocol

from shared.errors import ConfigurationError
from shared.settings import Settings


class RedisClient(Protocol):
    prefix: str

    def key(self, name: str) -> str: ...

    def ping(self) -> bool: ...

    def llen(self, name: str) -> int: ...

    def lrange(self, name: str, start: int, stop: int) -> list[str]: ...

    def lpush(self, name: str, *values: str) -> int: ...

    def rpush(self, name: str, *values: str) -> int: ...

    def lrem(self, name: str, count: int, value: str) -> int: ...

    def lmove(self, source: str, destination: str, src: str = "RIGHT",
              dest: str = "LEFT") -> str | None: ...

    def delete(self, *names: str) -> int: ...

    def eval(self, script: str, keys: list[str], args: list[Any]) -> Any: ...


class RedisPyClient:
    """redis-py over TCP (``SLUICE_REDIS_URL``)."""

    def __init__(self, client: Any, prefix: str = "") -> None:
        self.client = client
        self.prefix = prefix

    def key(self, name: str) -> str:
        return self.prefix + name

    def ping(self) -> bool:
        return bool(self.client.ping())

    def llen(self, name: str) -> int:
        return int(self.client.llen(self.key(name)))

    def lrange(self, name: str, start: int, stop: int) -> list[str]:
        return list(self.client.lrange(self.key(name), start, stop))

    def lpush(self, name: str, *values: str) -> int:
        return int(self.client.lpush(self.key(name), *values))

    def rpush(self, name: str, *values: str) -> int:
        return int(self.client.rpush(self.key(name), *values))

    def lrem(self, name: str, count: int, value: str) -> int:
        return int(self.client.lrem(self.key(name), count, value))

    def lmove(self, source: str, destination: str, src: str = "RIGHT",
              dest: str = "LEFT") -> str | None:
        value: str | None = self.client.lmove(self.key(source), self.key(destination), src, dest)
        return value

    def delete(self, *names: str) -> int:
        return int(self.client.delete(*(self.key(n) for n in names))) if names else 0

    def eval(self, script: str, keys: list[str], args: list[Any]) -> Any:
        return self.client.eval(script, len(keys), *(self.key(k) for k in keys), *args)


def connect(settings: Settings) -> RedisClient:
    if settings.redis_url:
        import redis

        client = redis.Redis.from_url(settings.redis_url, decode_responses=True,
                                      socket_connect_timeout=5, socket_timeout=10)
        return RedisPyClient(client, settings.redis_key_prefix)
    if settings.upstash_redis_rest_url:
        raise ConfigurationError("UPSTASH_REDIS_REST_URL: the REST client is not wired yet")
    raise ConfigurationError("no Redis configured (SLUICE_REDIS_URL or UPSTASH_REDIS_REST_URL)")
