"""A local stand-in for Upstash's Redis REST API, in front of the real Redis.

It speaks what upstash-redis sends: ``POST /`` with a JSON command array,
``POST /pipeline`` and ``POST /multi-exec`` with an array of them, path-style
``/cmd/arg/...``, a bearer token (or ``?_token=``), and base64-encoded results
when ``Upstash-Encoding: base64`` is asked. Answers are ``{"result": ...}`` or
``{"error": "..."}`` (400; 401 for a bad token), as the real service gives them.
Each request is counted, so tests can check round trips.
"""

from __future__ import annotations

import base64
import json
import threading
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis

from tests.providers.http import ProviderServer, StandIn, json_response


def _encode(value: Any, b64: bool) -> Any:
    if isinstance(value, bytes):
        if value == b"OK":
            return "OK"
        return base64.b64encode(value).decode() if b64 else value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [_encode(v, b64) for v in value]
    if isinstance(value, redis.ResponseError):
        return {"error": str(value)}
    return value  # int or None


def _arg(value: Any) -> bytes:
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, (int, float)):
        return str(value).encode()
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value).encode()


class UpstashRestServer(StandIn):
    """``with UpstashRestServer(redis_url, token) as server: server.url``"""

    def __init__(self, redis_url: str, token: str = "upstash-test-token") -> None:
        self.token = token
        self.pool = redis.ConnectionPool.from_url(redis_url)
        self.calls: list[str] = []  # "command", "pipeline" or "multi-exec", one per request
        self._lock = threading.Lock()
        self.http = ProviderServer(self._handle)
        # Headers and body go out as two writes: without TCP_NODELAY, Nagle and delayed ACKs
        # add ~40 ms to every keep-alive request and drown the latency being measured.
        self.http.server.RequestHandlerClass.disable_nagle_algorithm = True  # type: ignore[attr-defined]
        self.fail_next: list[int] = []  # HTTP statuses to answer (with an HTML body) next
        self.pool.disconnect()

    def reset_counts(self) -> None:
        with self._lock:
            self.calls.clear()

    # --- Redis -------------------------------------------------------------

    def _run(self, commands: list[list[Any]], *, transaction: bool) -> list[Any]:
        conn = self.pool.get_connection()
        try:
            if transaction:
                conn.send_command("MULTI")
                conn.read_response()
                for command in commands:
                    conn.send_command(*(_arg(a) for a in command))
                    conn.read_response()  # QUEUED, or raises for a command Redis refuses
                conn.send_command("EXEC")
                results = conn.read_response()
                return list(results) if results is not None else []
            out: list[Any] = []
            for command in commands:
                conn.send_command(*(_arg(a) for a in command))
                try:
                    out.append(conn.read_response())
                except redis.ResponseError as exc:
                    out.append(exc)
            return out
        except redis.ResponseError:
            conn.send_command("DISCARD")
            try:
                conn.read_response()
            except redis.ResponseError:
                pass
            raise
        finally:
            self.pool.release(conn)

    # --- HTTP --------------------------------------------------------------

    def _handle(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        parts = urlsplit(path)
        token = (headers.get("authorization", "").removeprefix("Bearer ")
                 or parse_qs(parts.query).get("_token", [""])[0])
        if token != self.token:
            return json_response(401, {"error": "Unauthorized"})
        if self.fail_next:
            status = self.fail_next.pop(0)
            return status, {"content-type": "text/html"}, b"<html>bad gateway</html>"
        b64 = headers.get("upstash-encoding", "").lower() == "base64"
        route = parts.path.rstrip("/")
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            return json_response(400, {"error": "ERR failed to parse command"})
        with self._lock:
            self.calls.append(route.lstrip("/") or "command")
        if route in ("/pipeline", "/multi-exec"):
            if not isinstance(payload, list) or not all(isinstance(c, list) and c
                                                        for c in payload):
                return json_response(400, {"error": "ERR pipeline body must be an array of "
                                                    "command arrays"})
            try:
                results = self._run(payload, transaction=route == "/multi-exec")
            except redis.ResponseError as exc:
                return json_response(400, {"error": str(exc)})
            return json_response(200, [
                {"error": str(r)} if isinstance(r, redis.ResponseError)
                else {"result": _encode(r, b64)} for r in results])
        command = payload if route in ("", "/") else [unquote(p) for p in route.split("/")[1:]]
        if not isinstance(command, list) or not command:
            return json_response(400, {"error": "ERR command must be a non-empty array"})
        (result,) = self._run([command], transaction=False)
        if isinstance(result, redis.ResponseError):
            return json_response(400, {"error": str(result)})
        return json_response(200, {"result": _encode(result, b64)})
