"""A Sentry ingest endpoint: accepts envelopes at /api/<project>/envelope/ and keeps their items."""

from __future__ import annotations

import gzip
import json
from typing import Any, Self

from tests.providers.http import ProviderServer, json_response


class SentryIngest:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.server = ProviderServer(self._handle)

    def _handle(self, method: str, path: str, headers: dict[str, str], body: bytes,
                ) -> tuple[int, dict[str, str], bytes]:
        if method != "POST" or not path.startswith("/api/1/envelope"):
            return json_response(404, {"detail": "not found"})
        if headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        lines = body.split(b"\n")
        # envelope header, then (item header, payload) pairs
        i = 1
        while i + 1 < len(lines):
            header = json.loads(lines[i])
            payload = lines[i + 1]
            try:
                parsed = json.loads(payload)
            except ValueError:
                parsed = payload.decode(errors="replace")
            self.items.append({"type": header.get("type"), "payload": parsed})
            i += 2
        return json_response(200, {"id": "0" * 32})

    @property
    def dsn(self) -> str:
        return self.server.url.replace("http://", "http://publickey@") + "/1"

    def of_type(self, kind: str) -> list[Any]:
        return [item["payload"] for item in self.items if item["type"] == kind]

    def __enter__(self) -> Self:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)
