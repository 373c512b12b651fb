"""Refuse input that cannot be decoded or stored before any route sees it.

A NUL byte, a control character, bytes that are not UTF-8, JSON nested deeper
than ``sluice.core.validate.MAX_DEPTH``, or a JSON string with a lone surrogate — in the path, the query string, a header or the body — is
answered ``400 bad_request`` naming where it was. Such a value could otherwise
reach the store (Postgres refuses NUL in ``text`` and ``jsonb``) only after an
action had been taken, and turn a refusal into a ``5xx``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote_to_bytes

from sluice.core.errors import RequestError
from sluice.core.validate import check_depth

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY_BYTES = 1024 * 1024
_CONTROL = frozenset(range(0x20)) | {0x7F}
_HEADER_CONTROL = _CONTROL - {0x09}
_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})


class BadInput(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _decoded(raw: bytes, where: str, *, plus_is_space: bool = False) -> str:
    if plus_is_space:
        raw = raw.replace(b"+", b" ")
    data = unquote_to_bytes(raw)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"the {where} is not valid UTF-8") from None
    if any(ord(ch) in _CONTROL for ch in text):
        raise BadInput(f"the {where} holds a NUL or control character")
    return text


def check_head(scope: Scope) -> None:
    """Path, query string and headers."""
    raw_path = scope.get("raw_path")
    if isinstance(raw_path, bytes | bytearray):
        _decoded(bytes(raw_path), "path")
    elif any(ord(ch) in _CONTROL for ch in scope.get("path", "")):
        raise BadInput("the path holds a NUL or control character")
    query: bytes = scope.get("query_string") or b""
    for pair in query.split(b"&"):
        name, _, value = pair.partition(b"=")
        _decoded(name, "query string", plus_is_space=True)
        _decoded(value, "query string", plus_is_space=True)
    for name, value in scope.get("headers") or ():
        if any(b in _HEADER_CONTROL for b in name) or any(b in _HEADER_CONTROL for b in value):
            raise BadInput(f"header {name.decode('latin-1')!r} holds a NUL or control character")


def _storable(value: Any) -> bool:
    if isinstance(value, str):
        if "\x00" in value:
            return False
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape
            return False
        return True
    if isinstance(value, dict):
        return all(_storable(k) and _storable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_storable(v) for v in value)
    return True


def check_body(body: bytes, content_type: str = "") -> None:
    if not body:
        return
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput("the body is not valid UTF-8") from None
    if "\x00" in text:
        raise BadInput("the body holds a NUL byte")
    if content_type.startswith("application/x-www-form-urlencoded"):
        for pair in body.split(b"&"):
            name, _, value = pair.partition(b"=")
            _decoded(name, "form", plus_is_space=True)
            _decoded(value, "form", plus_is_space=True)
        return
    try:
        # Bounded before any recursive parser runs: deep nesting is a 400 on every route,
        # authenticated or not, never a RecursionError.
        check_depth(text)
    except RequestError as exc:
        raise BadInput(f"the {exc.message}") from None
    try:
        data = json.loads(text)
    except ValueError:
        return  # not JSON: the route's own parsing answers
    if not _storable(data):
        raise BadInput("the body holds a NUL character or a lone surrogate")


class InputGuard:
    """ASGI middleware: ``check_head``, then the whole body (``check_body``), replayed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            check_head(scope)
            if scope.get("method") in _BODYLESS:
                await self.app(scope, receive, send)
                return
            body = await _read_body(receive)
            check_body(body, _header(scope, b"content-type"))
        except BadInput as exc:
            await _refuse(scope, send, exc)
            return
        await self.app(scope, _replay(body, receive), send)


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return str(value.decode("latin-1")).lower()
    return ""


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadInput(f"the body is larger than {MAX_BODY_BYTES} bytes", status=413)
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(scope: Scope, send: Send, exc: BadInput) -> None:
    state = scope.get("state") or {}
    request_id = state.get("request_id", "unknown") if isinstance(state, dict) else "unknown"
    code = "bad_request" if exc.status == 400 else "payload_too_large"
    payload = json.dumps({"error": {"code": code, "message": str(exc),
                                    "requestId": request_id}}).encode()
    await send({"type": "http.response.start", "status": exc.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
