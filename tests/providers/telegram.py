"""A local stand-in for the Telegram Bot API's ``sendMessage`` (and ``sendPhoto``,
``sendDocument``, ``sendAnimation`` by URL).

As documented: ``POST /bot<token>/sendMessage`` with ``{chat_id, text, parse_mode?,
disable_notification?, message_thread_id?, reply_parameters?}``. Success is ``{"ok":
true, "result": Message}``; failure is ``{"ok": false, "error_code", "description"}``
with the HTTP status equal to ``error_code``: ``401 Unauthorized`` (wrong token),
``400 Bad Request: chat not found``, ``400 Bad Request: message is too long`` (over 4096
characters of text after entity parsing), ``400 Bad Request: can't parse entities: …``
(``parse_mode=HTML`` with an unsupported or unclosed tag, or a bare ``<``, ``>`` or
``&``), ``403 Forbidden: bot was blocked by the user``, and ``429 Too Many Requests:
retry after N`` with ``parameters.retry_after``.
"""

from __future__ import annotations

import html
import json
import re
import threading
import time
from typing import Any, NamedTuple

from tests.providers.http import ProviderServer, StandIn, json_response

MAX_TEXT = 4096
_TAGS = ("b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "code", "pre",
         "tg-spoiler", "blockquote", "a")
_TOKEN = re.compile(r"<(/?)([a-z-]+)(\s[^<>]*)?>|&(#\d+|#x[0-9a-fA-F]+|lt|gt|amp|quot);|[<>&]")


def parse_html(text: str) -> str:
    """Telegram's HTML parse mode: the visible text, or ValueError as Telegram words it."""
    out, stack, at = [], [], 0
    for match in _TOKEN.finditer(text):
        out.append(text[at:match.start()])
        at = match.end()
        closing, tag, entity = match.group(1), match.group(2), match.group(4)
        if entity is not None:
            out.append(html.unescape(match.group(0)))
        elif tag is None:
            raise ValueError(f"can't parse entities: unexpected {match.group(0)!r} at byte "
                             f"offset {match.start()}")
        elif tag not in _TAGS:
            raise ValueError(f"can't parse entities: Unsupported start tag \"{tag}\" at byte "
                             f"offset {match.start()}")
        elif closing:
            if not stack or stack.pop() != tag:
                raise ValueError(f"can't parse entities: Unmatched end tag at byte offset "
                                 f"{match.start()}, expected \"</{stack[-1] if stack else ''}>\"")
        else:
            stack.append(tag)
    if stack:
        raise ValueError(f"can't parse entities: Can't find end tag corresponding to start tag "
                         f"\"{stack[-1]}\"")
    out.append(text[at:])
    return "".join(out)


def error(code: int, description: str, **parameters: Any) -> tuple[int, dict[str, str], bytes]:
    body: dict[str, Any] = {"ok": False, "error_code": code, "description": description}
    if parameters:
        body["parameters"] = parameters
    return json_response(code, body)


def flood(wait: int | str) -> tuple[int, dict[str, str], bytes]:
    """429 with ``parameters.retry_after``; a str is spliced into the JSON as it is (a
    hostile peer's ``NaN``, ``1e400``, ``-5``, ``"30"``)."""
    if isinstance(wait, int):
        return error(429, f"Too Many Requests: retry after {wait}", retry_after=wait)
    status, headers, body = error(429, "Too Many Requests: retry after ?", retry_after=0)
    return status, headers, body.replace(b'"retry_after": 0', b'"retry_after": ' + wait.encode())


class Late(NamedTuple):
    """A scripted step: take the message as Telegram would, then answer this much later."""

    seconds: float


# A scripted step: None answers as Telegram would; (status, body) answers that instead.
Step = Late | tuple[int, dict[str, Any]] | None

# sendPhoto / sendDocument / sendAnimation: the file (an https URL here) in its own field.
_MEDIA = {"sendphoto": "photo", "senddocument": "document", "sendanimation": "animation"}


class TelegramStandIn(StandIn):
    def __init__(self, token: str = "123456:TEST-token", chats: tuple[str, ...] = ("1001",),
                 blocked: tuple[str, ...] = ()) -> None:
        self.token = token
        self.chats = set(chats)
        self.blocked = set(blocked)
        # answer 429 with these retry_after values first (a str goes into the JSON raw)
        self.flood_wait: list[int | str] = []
        self.late_s = 0.0  # accept the message, then answer this much later
        self.script: list[Step] = []  # one step per request, before anything else
        self.messages: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.http = ProviderServer(self._handle)

    def _handle(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        token, _, name = path.removeprefix("/bot").partition("/")
        if token != self.token:
            return error(401, "Unauthorized")
        media = _MEDIA.get(name.lower())
        if name.lower() != "sendmessage" and media is None:
            return error(404, "Not Found")
        step = self.script.pop(0) if self.script else None
        if isinstance(step, tuple) and not isinstance(step, Late):
            return json_response(step[0], step[1])
        late_s = step.seconds if isinstance(step, Late) else self.late_s
        if self.flood_wait:
            return flood(self.flood_wait.pop(0))
        data = json.loads(body or b"{}")
        chat, text = str(data.get("chat_id", "")), data.get("text") or ""
        if not chat:
            return error(400, "Bad Request: chat_id is empty")
        if chat in self.blocked:
            return error(403, "Forbidden: bot was blocked by the user")
        if chat not in self.chats:
            return error(400, "Bad Request: chat not found")
        if media is not None:
            return self._media(name, media, chat, data)
        if not text:
            return error(400, "Bad Request: message text is empty")
        mode = data.get("parse_mode")
        if mode not in (None, "HTML"):
            return error(400, f"Bad Request: unsupported parse_mode {mode!r} in this stand-in")
        try:
            visible = parse_html(text) if mode == "HTML" else text
        except ValueError as exc:
            return error(400, f"Bad Request: {exc}")
        if len(visible) > MAX_TEXT:
            return error(400, "Bad Request: message is too long")
        with self._lock:
            message_id = len(self.messages) + 1
            self.messages.append({
                "chat_id": chat, "text": visible, "raw": text, "message_id": message_id,
                "parse_mode": mode, "silent": bool(data.get("disable_notification")),
                "thread_id": data.get("message_thread_id"),
                "reply_to": (data.get("reply_parameters") or {}).get("message_id"),
                "received_at": time.monotonic()})
        if late_s:
            time.sleep(late_s)
        return json_response(200, {"ok": True, "result": {
            "message_id": message_id, "date": int(time.time()),
            "chat": {"id": int(chat), "type": "private"}, "text": text}})

    def _media(self, name: str, field: str, chat: str,
               data: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        url = data.get(field)
        if not isinstance(url, str) or not url.startswith("https://"):
            return error(400, f"Bad Request: there is no {field} in the request")
        with self._lock:
            message_id = len(self.messages) + 1
            self.messages.append({"chat_id": chat, "method": name, field: url,
                                  "message_id": message_id,
                                  "silent": bool(data.get("disable_notification"))})
        return json_response(200, {"ok": True, "result": {
            "message_id": message_id, "date": int(time.time()),
            "chat": {"id": int(chat), "type": "private"}}})
