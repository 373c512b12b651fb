"""Redis behind one small Protocol: redis-py over TCP, or upstash-redis over REST.

Keys are given without the settings' key prefix; the client adds it. Only the
commands Sluice uses are here, so both transports can be checked by one
contract suite against the real Redis. Errors are translated at this boundary:
an unreachable Redis is a ``TransientStoreError``, a rejected command a
``PermanentStoreError``.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from sluice.core.errors import ConfigurationError, PermanentStoreError, TransientStoreError
from sluice.core.settings import Settings
from sluice.store.deadline import abandon_at_deadline

# The AI usage ledger retry lists (public contract; see docs/billing.md).
LEDGER_RETRY_QUEUE = "ai:ledger:retry:queue"
LEDGER_RETRY_PROCESSING = "ai:ledger:retry:processing"
LEDGER_RETRY_DLQ = "ai:ledger:retry:dlq"


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

    def eval(self, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run a Lua script atomically; ``keys`` are prefixed, ``args`` are sent as strings."""
        ...


@contextmanager
def _redis_py_errors() -> Iterator[None]:
    import redis

    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise TransientStoreError(f"redis: {exc}") from exc
    except redis.RedisError as exc:
        raise PermanentStoreError(f"redis: {exc}") from exc


class _PrefixedClient:
    """The commands both transports share: keys get the prefix, driver errors a type."""

    def __init__(self, client: Any, prefix: str = "") -> None:
        self.client = client
        self.prefix = prefix

    def _errors(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def key(self, name: str) -> str:
        return self.prefix + name

    def llen(self, name: str) -> int:
        with self._errors():
            return int(self.client.llen(self.key(name)))

    def lrange(self, name: str, start: int, stop: int) -> list[str]:
        with self._errors():
            return list(self.client.lrange(self.key(name), start, stop))

    def lpush(self, name: str, *values: str) -> int:
        with self._errors():
            return int(self.client.lpush(self.key(name), *values))

    def rpush(self, name: str, *values: str) -> int:
        with self._errors():
            return int(self.client.rpush(self.key(name), *values))

    def lrem(self, name: str, count: int, value: str) -> int:
        with self._errors():
            return int(self.client.lrem(self.key(name), count, value))

    def lmove(self, source: str, destination: str, src: str = "RIGHT",
              dest: str = "LEFT") -> str | None:
        with self._errors():
            value: str | None = self.client.lmove(self.key(source), self.key(destination),
                                                  src, dest)
            return value

    def delete(self, *names: str) -> int:
        if not names:
            return 0
        with self._errors():
            return int(self.client.delete(*(self.key(n) for n in names)))

    def close(self) -> None:
        self.client.close()


class RedisPyClient(_PrefixedClient):
    """redis-py over TCP (``SLUICE_REDIS_URL``)."""

    def _errors(self) -> AbstractContextManager[None]:
        return _redis_py_errors()

    def ping(self) -> bool:
        with self._errors():
            return bool(self.client.ping())

    def eval(self, script: str, keys: list[str], args: list[Any]) -> Any:
        with self._errors():
            return self.client.eval(script, len(keys), *(self.key(k) for k in keys),
                                    *(str(a) for a in args))


class _Watched:
    """Mixed into the pool's connection class: each wait on the socket (connecting,
    sending, reading a reply) is abandoned at the run's deadline (``sluice.store.deadline``),
    so a Redis that stops answering mid-run cannot hold the run past it."""

    _sock: Any

    def _cut(self) -> None:
        sock = self._sock
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)

    def _watched(self, call: Callable[[], Any]) -> Any:
        with abandon_at_deadline(self._cut) as watch:
            try:
                return call()
            finally:
                if watch.fired:
                    # redis-py reconnects and retries on its own: say why it must not.
                    raise TransientStoreError("redis: no answer by the run's deadline; "
                                              "the connection was abandoned")

    def connect(self) -> None:
        self._watched(super().connect)  # type: ignore[misc]

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._watched(lambda: super(_Watched, self).send_packed_command(  # type: ignore[misc]
            command, check_health))

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        return self._watched(lambda: super(_Watched, self).read_response(  # type: ignore[misc]
            *args, **kwargs))


def watch_deadlines(client: Any) -> None:
    """Make every connection ``client``'s pool opens from now on watched (``_Watched``)."""
    pool = client.connection_pool
    base = pool.connection_class
    if not issubclass(base, _Watched):
        pool.connection_class = type(f"Watched{base.__name__}", (_Watched, base), {})


@contextmanager
def _upstash_errors() -> Iterator[None]:
    from upstash_redis.errors import UpstashError

    from sluice.egress.errors import library_transport_errors

    unanswered: tuple[type[BaseException], ...] = (*library_transport_errors(),
                                                   json.JSONDecodeError)
    try:
        yield
    except unanswered as exc:
        # No answer, or not Upstash's JSON (a proxy's 502 page): the same call may work later.
        raise TransientStoreError(f"upstash: {exc}") from exc
    except UpstashError as exc:
        raise PermanentStoreError(f"upstash: {exc}") from exc


class UpstashClient(_PrefixedClient):
    """upstash-redis over REST (``UPSTASH_REDIS_REST_URL`` / ``UPSTASH_REDIS_REST_TOKEN``).

    Results travel base64-encoded (``Upstash-Encoding: base64``), so list items that are
    not valid JSON text survive the trip unchanged.
    """

    @classmethod
    def from_url(cls, url: str, token: str, prefix: str = "", *, retries: int = 1,
                 retry_interval_s: float = 0.5) -> UpstashClient:
        from upstash_redis import Redis

        client = Redis(url=url, token=token, rest_encoding="base64", rest_retries=retries,
                       rest_retry_interval=retry_interval_s, allow_telemetry=False)
        return cls(client, prefix)

    def _errors(self) -> AbstractContextManager[None]:
        return _upstash_errors()

    def ping(self) -> bool:
        with self._errors():
            return bool(self.client.ping() == "PONG")

    def eval(self, script: str, keys: list[str], args: list[Any]) -> Any:
        with self._errors():
            return self.client.eval(script, keys=[self.key(k) for k in keys],
                                    args=[str(a) for a in args])


def connect(settings: Settings) -> RedisClient:
    if settings.redis_url:
        import redis
        from redis.backoff import ExponentialWithJitterBackoff
        from redis.retry import Retry

        # Short retry pauses: a reconnect after a dropped idle connection is worth one,
        # but the default pauses (up to seconds) would overrun a run's deadline.
        client = redis.Redis.from_url(
            settings.redis_url, decode_responses=True, socket_connect_timeout=5,
            socket_timeout=10,
            retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries=3))
        watch_deadlines(client)
        return RedisPyClient(client, settings.redis_key_prefix)
    if settings.upstash_redis_rest_url and settings.upstash_redis_rest_token:
        return UpstashClient.from_url(settings.upstash_redis_rest_url,
                                      settings.upstash_redis_rest_token,
                                      settings.redis_key_prefix)
    raise ConfigurationError("no Redis configured (SLUICE_REDIS_URL or UPSTASH_REDIS_REST_URL)")
