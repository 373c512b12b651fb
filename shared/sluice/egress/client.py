"""``Egress``: the one HTTP client of Sluice's outbound calls.

Every request has a total deadline (``deadline_at``, never past the caller's; headers,
body and name resolution included), its body is read with a cap on decoded bytes, and
its destination goes through an ``AddressGuard``: the destination kind's guard for URLs
named in data (feeds, webhooks), ``trusted()`` for provider base URLs from settings. The
answer comes back whole as an ``Answer``; failures come back as the types of
``sluice.egress.errors``, so no caller sees the HTTP library.

No proxy from the environment is used (``HTTPS_PROXY`` would route around the guard and
the deadline); TLS verification uses the process's context.
"""

from __future__ import annotations

import json as jsonlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self

import httpcore
import httpx

from sluice.egress.body import Decoder, read_capped
from sluice.egress.deadline import DeadlineBackend, deadline_at
from sluice.egress.errors import (
    AnswerRefused,
    DestinationRefused,
    NoAnswer,
    NotSent,
    TooLarge,
)
from sluice.egress.guard import AddressGuard, trusted
from sluice.egress.tls import tls_context
from sluice.egress.urls import parse_url

# What a provider's answer (an id, an error text) may be: more is cut, never buffered.
ANSWER_BYTES = 64 * 1024


@dataclass(frozen=True)
class Answer:
    """An answer; ``cut`` says why its body is not whole: at the size ``cap``, or at the
    ``deadline`` (the body stopped arriving after the status line)."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    url: str
    cut: Literal["", "cap", "deadline"] = ""

    @property
    def complete(self) -> bool:
        return not self.cut

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON (``ValueError`` when it is not)."""
        return jsonlib.loads(self.body)


class Egress:
    """An HTTP client whose every request ends by its deadline, with a capped body."""

    def __init__(self, *, timeout_s: float, guard: AddressGuard | None = None,
                 max_connections: int = 10, headers: Mapping[str, str] | None = None,
                 verify_env: bool = True, deadline: float | None = None) -> None:
        self.timeout_s = timeout_s
        self.deadline = deadline  # the owner's (a run's) own: no request outlives it
        self.guard = guard or trusted()
        # SSL_CERT_FILE/_DIR are honoured for providers the operator configured, not for
        # destinations named in data
        context = tls_context(trust_env=verify_env and guard is None)
        pool = httpcore.ConnectionPool(
            ssl_context=context, max_connections=max_connections,
            max_keepalive_connections=max_connections,
            network_backend=DeadlineBackend(self.guard))
        self._client = httpx.Client(transport=_Transport(pool), timeout=timeout_s,
                                    follow_redirects=False, trust_env=False,
                                    headers={"accept-encoding": "gzip, deflate",
                                             **(headers or {})})

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, url: str, *, headers: Mapping[str, str] | None = None,
                content: bytes | None = None, json: Any = None,
                deadline: float | None = None, max_bytes: int = ANSWER_BYTES,
                truncate: bool = True) -> Answer:
        """One request, ended by ``deadline`` (``time.monotonic`` seconds; the client's
        timeout from now when None, and never later than that).

        The body is cut at ``max_bytes`` decoded bytes (``truncate``: an answer with
        ``cut="cap"``; else ``TooLarge``). With ``truncate``, a body that stops
        arriving at the deadline after the status line is also returned cut: the status is
        the answer. Raises ``DestinationRefused``, ``NotSent``, ``NoAnswer`` or
        ``AnswerRefused``.
        """
        stop = min(d for d in (time.monotonic() + self.timeout_s, deadline, self.deadline)
                   if d is not None)
        if not self.guard.trust_all:
            parse_url(url, field=self.guard.field)  # a host only a resolver would read: refused
        if stop <= time.monotonic():
            raise NotSent("the deadline passed before sending")
        if json is not None:
            content = jsonlib.dumps(json, separators=(",", ":")).encode()
            headers = {"content-type": "application/json", **(headers or {})}
        with deadline_at(stop):
            try:
                # every wait, the pool's included, is at most the time left; the streams
                # cut each socket wait to what is left when it starts
                request = self._client.build_request(
                    method, url, headers=headers, content=content,
                    timeout=min(self.timeout_s, max(0.001, stop - time.monotonic())))
            except (httpx.InvalidURL, httpx.UnsupportedProtocol, ValueError, UnicodeError):
                raise DestinationRefused("the URL cannot be parsed (host, port or brackets)",
                                         field=self.guard.field) from None
            try:
                response = self._client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                raise NotSent(_why(exc)) from None
            except httpx.UnsupportedProtocol:
                raise DestinationRefused("only http and https URLs are allowed",
                                         field=self.guard.field) from None
            except httpx.TransportError as exc:
                raise NoAnswer(_why(exc)) from None
            try:
                return self._read(response, max_bytes, truncate)
            finally:
                response.close()

    def _read(self, response: httpx.Response, max_bytes: int, truncate: bool) -> Answer:
        status = response.status_code
        cut: Literal["", "cap", "deadline"] = ""
        try:
            decoder = Decoder(response.headers.get_list("content-encoding"))
            declared = response.headers.get("content-length", "")
            if (not truncate and not decoder.encoding and declared.isdigit()
                    and int(declared) > max_bytes):
                raise TooLarge(f"the answer is {declared} bytes, over the {max_bytes} limit")
            body, complete = read_capped(response.iter_raw(), decoder, max_bytes,
                                         truncate=truncate)
            cut = "" if complete else "cap"
        except AnswerRefused as exc:
            exc.http_status = status
            raise
        except httpx.TransportError as exc:
            if not truncate:
                raise NoAnswer(f"the answer's body stopped: {_why(exc)}") from None
            body, cut = b"", "deadline"
        return Answer(status, response.headers, body, str(response.url), cut)


class _Transport(httpx.HTTPTransport):
    """httpx's transport over our pool (its own constructor would build, and load TLS
    for, a pool that is never used)."""

    def __init__(self, pool: httpcore.ConnectionPool) -> None:
        self._pool = pool


_TIMEOUTS = {"ConnectTimeout": "timed out connecting",
             "PoolTimeout": "timed out waiting for a free connection",
             "ReadTimeout": "timed out: no complete answer by the deadline",
             "WriteTimeout": "timed out sending the request"}


def _why(exc: httpx.HTTPError) -> str:
    """A transport error as text. Connections are made to checked addresses by host, so
    the library's message names no address that was not in the URL."""
    name = type(exc).__name__
    if name in _TIMEOUTS:
        return _TIMEOUTS[name]
    text = str(exc)
    return f"{name}: {text}" if text else name
