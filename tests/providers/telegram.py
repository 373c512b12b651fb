"""A local stand-in for the Telegram Bot API's ``sendMessage``.

As documented: ``POST /bot<token>/sendMessage`` with ``{chat_id, text, parse_mode?,
disable_notification?}``. Success is ``{"ok": true, "result": Message}``; failure is
``{"ok": false, "error_code", "description"}`` with the HTTP status equal to
``error_code``: ``401 Unauthorized`` (wrong token), ``400 Bad Request: chat not found``,
``400 Bad Request: message is too long`` (over 4096 characters), ``403 Forbidden: bot was
blocked by the user``, and ``429 Too Many Requests: retry after N`` with
``parameters.retry_after``.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from tests.providers.http import ProviderServer, StandIn, json_response

MAX_TEXT = 4096


def error(code: int, description: str, **parameters: Any) -> tuple[int, dict[str, str], bytes]:
    body: dict[str, Any] = {"ok": False, "error_code": code, "description": description}
    if parameters:
        body["parameters"] = parameters
    return json_response(code, body)


class TelegramStandIn(StandIn):
    def __init__(self, token: str = "123456:TEST-token", chats: tuple[str, ...] = ("1001",),
                 blocked: tuple[str, ...] = ()) -> None:
        self.token = token
        self.chats = set(chats)
        self.blocked = set(blocked)
        self.flood_wait: list[int] = []  # answer 429 with these retry_after values first
        self.messages: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.http = ProviderServer(self._handle)

    def _handle(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        token, _, name = path.removeprefix("/bot").partition("/")
        if token != self.token:
            return error(401, "Unauthorized")
        if name.lower() != "sendmessage":
            return error(404, "Not Found")
        if self.flood_wait:
            wait = self.flood_wait.pop(0)
            return error(429, f"Too Many Requests: retry after {wait}", retry_after=wait)
        data = json.loads(body or b"{}")
        chat, text = str(data.get("chat_id", "")), data.get("text") or ""
        if not chat:
            return error(400, "Bad Request: chat_id is empty")
        if chat in self.blocked:
            return error(403, "Forbidden: bot was blocked by the user")
        if chat not in self.chats:
            return error(400, "Bad Request: chat not found")
        if not text:
            return error(400, "Bad Request: message text is empty")
        if len(text) > MAX_TEXT:
            return error(400, "Bad Request: message is too long")
        with self._lock:
            message_id = len(self.messages) + 1
            self.messages.append({"chat_id": chat, "text": text, "message_id": message_id})
        return json_response(200, {"ok": True, "result": {
            "message_id": message_id, "date": int(time.time()),
            "chat": {"id": int(chat), "type": "private"}, "text": text}})
