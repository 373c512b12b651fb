"""Loopback stand-ins for the scale benchmark: slow feeds, and providers that enforce
their rate limits (a sliding window per key) and answer 429 with ``retry_after`` beyond
them, counting every message they accept so duplicates and losses show."""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter, deque
from typing import Any, Self

from tests.providers.feeds import FeedServer
from tests.providers.http import ProviderServer, json_response


class SlowFeeds(FeedServer):
    """Every feed answers after ``delay_s`` (a publisher's real latency)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        handle = self._handle

        def slow(method: str, path: str, headers: dict[str, str],
                 body: bytes) -> tuple[int, dict[str, str], bytes]:
            time.sleep(self.delay_s)
            return handle(method, path, headers, body)

        self.http = ProviderServer(slow)
        self.http.server.RequestHandlerClass.disable_nagle_algorithm = True  # type: ignore[attr-defined]


class Window:
    """The moments of the last accepted messages of one key (at most ``limit`` in ``period_s``)."""

    def __init__(self, limit: int, period_s: float) -> None:
        self.limit = limit
        self.period_s = period_s
        self.times: deque[float] = deque()


def quick(server: ProviderServer) -> ProviderServer:
    """Headers and body go out as two writes: without TCP_NODELAY a kept-alive connection
    waits for a delayed ACK between them (~40 ms), which no real provider does."""
    server.server.RequestHandlerClass.disable_nagle_algorithm = True  # type: ignore[attr-defined]
    return server


class LimitedProvider:
    """Counts accepted messages by their id; refuses past its windows."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.windows: dict[str, Window] = {}
        self.accepted: Counter[str] = Counter()
        self.refused = 0

    def admit(self, keys: list[tuple[str, int, float]], message: str) -> float:
        now = time.monotonic()
        with self.lock:
            waits = []
            for key, limit, period in keys:
                window = self.windows.setdefault(key, Window(limit, period))
                while window.times and now - window.times[0] >= window.period_s:
                    window.times.popleft()
                if len(window.times) >= window.limit:
                    waits.append(window.times[0] + window.period_s - now)
            if waits:
                self.refused += 1
                return max(waits)
            for key, limit, period in keys:
                self.windows[key].times.append(now)
            self.accepted[message] += 1
            return 0.0


class LimitedTelegram(LimitedProvider):
    def __init__(self, token: str, per_bot: int, per_chat: int) -> None:
        super().__init__()
        self.token = token
        self.per_bot = per_bot
        self.per_chat = per_chat
        self.http = quick(ProviderServer(self._handle))

    @property
    def url(self) -> str:
        return self.http.url

    def __enter__(self) -> Self:
        self.http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.__exit__(*exc)

    def _handle(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        data = json.loads(body or b"{}")
        chat = str(data.get("chat_id"))
        wait = self.admit([("bot", self.per_bot, 1.0), (f"chat:{chat}", self.per_chat, 1.0)],
                          str(data.get("text")))
        if wait > 0:
            return json_response(429, {"ok": False, "error_code": 429,
                                       "description": "Too Many Requests",
                                       "parameters": {"retry_after": math.ceil(wait)}})
        return json_response(200, {"ok": True, "result": {"message_id": 1}})


class LimitedHooks(LimitedProvider):
    """Webhook receivers on ``hosts`` ports, each limited to ``per_host`` a second."""

    def __init__(self, hosts: int, per_host: int) -> None:
        super().__init__()
        self.per_host = per_host
        self.servers = [quick(ProviderServer(self._handler(n))) for n in range(hosts)]

    def _handler(self, n: int) -> Any:
        def handle(method: str, path: str, headers: dict[str, str],
                   body: bytes) -> tuple[int, dict[str, str], bytes]:
            wait = self.admit([(f"host:{n}", self.per_host, 1.0)],
                              headers.get("idempotency-key", ""))
            if wait > 0:
                return 429, {"retry-after": str(math.ceil(wait))}, b"slow down"
            return json_response(200, {"ok": True})
        return handle

    @property
    def urls(self) -> list[str]:
        return [server.url + "/hook" for server in self.servers]

    def __enter__(self) -> Self:
        for server in self.servers:
            server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self.servers:
            server.__exit__(*exc)
