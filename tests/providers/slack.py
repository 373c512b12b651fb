"""A local stand-in for Slack's ``chat.postMessage`` (Web API).

As documented: ``POST /api/chat.postMessage`` with ``Authorization: Bearer <bot token>``
and a JSON body ``{channel, text, …}``. Success is ``200 {"ok": true, "channel", "ts",
"message"}``; errors are *also* HTTP 200, ``{"ok": false, "error": "<code>"}``
(``invalid_auth``, ``channel_not_found``, ``is_archived``, ``msg_too_long``, ``no_text``);
rate limiting is ``429`` with ``Retry-After`` seconds and ``{"ok": false, "error":
"ratelimited"}``. ``blocks`` are at most 50, a section's text at most 3000 characters
(else ``invalid_blocks``); ``thread_ts`` answers in a thread. Tests script extra
answers in ``answers``.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from tests.providers.http import ProviderServer, StandIn, json_response

MAX_TEXT = 40_000
MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000


class SlackStandIn(StandIn):
    PATH = "/api"

    def __init__(self, token: str = "xoxb-test-token", channels: tuple[str, ...] = ("C0ALERTS",),
                 archived: tuple[str, ...] = ()) -> None:
        self.token = token
        self.channels = set(channels)
        self.archived = set(archived)
        self.answers: list[tuple[int, dict[str, Any], dict[str, str]]] = []
        self.messages: list[dict[str, Any]] = []
        self.late_s = 0.0  # accept the message, then answer this much later
        self._lock = threading.Lock()
        self.http = ProviderServer(self._handle)

    def _handle(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        if method != "POST" or path != "/api/chat.postMessage":
            return json_response(404, {"ok": False, "error": "unknown_method"})
        if self.answers:
            status, payload, extra = self.answers.pop(0)
            return json_response(status, payload, **extra)
        if headers.get("authorization") != f"Bearer {self.token}":
            return json_response(200, {"ok": False, "error": "invalid_auth"})
        data = json.loads(body or b"{}")
        channel, text = data.get("channel"), data.get("text")
        if channel in self.archived:
            return json_response(200, {"ok": False, "error": "is_archived"})
        if channel not in self.channels:
            return json_response(200, {"ok": False, "error": "channel_not_found"})
        if not text and not data.get("blocks"):
            return json_response(200, {"ok": False, "error": "no_text"})
        if len(text or "") > MAX_TEXT:
            return json_response(200, {"ok": False, "error": "msg_too_long"})
        blocks = data.get("blocks") or []
        if len(blocks) > MAX_BLOCKS or any(
                len(str((b.get("text") or {}).get("text", ""))) > MAX_SECTION_TEXT
                for b in blocks if isinstance(b, dict)):
            return json_response(200, {"ok": False, "error": "invalid_blocks"})
        with self._lock:
            ts = f"1700000000.{len(self.messages) + 1:06d}"
            message: dict[str, Any] = {"channel": channel, "text": text, "ts": ts}
            for key in ("thread_ts", "blocks"):
                if key in data:
                    message[key] = data[key]
            self.messages.append(message)
        if self.late_s:
            time.sleep(self.late_s)
        return json_response(200, {"ok": True, "channel": channel, "ts": ts,
                                   "message": {"type": "message", "text": text, "ts": ts}})
