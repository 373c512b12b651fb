"""The ``telegram`` channel: Bot API ``sendMessage``; the recipient is a chat id.

Each part is converted to Telegram HTML (``parse_mode=HTML``: ``&``, ``<``, ``>``
escaped; ``**bold**`` -> ``<b>``, ```code``` -> ``<code>``) and split into messages
of at most 4096 characters. ``silent`` -> ``disable_notification``, ``threadId`` ->
``message_thread_id`` (forum topics), ``replyToId`` -> ``reply_parameters`` of the
first message (sent anyway if that message is gone); ``accountId`` is ignored (one bot
per deployment). ``mediaUrl`` goes first, by URL (Telegram fetches it): ``sendDocument``
with ``forceDocument``, else ``sendAnimation`` with ``gifPlayback``, else ``sendPhoto``. Errors: ``{"ok": false, "error_code": 400, "description": "Bad
Request: chat not found"}``; 429 carries ``parameters.retry_after``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sluice.delivery.channels.base import (
    NO_PROGRESS,
    ChannelAdapter,
    Outbound,
    Progress,
    json_of,
    message_of,
    refused,
    send_chunks,
    transport_error,
)
from sluice.delivery.chunking import TELEGRAM_MAX_TEXT, chunk, to_telegram_html
from sluice.delivery.retry import Retrier
from sluice.delivery.store import DeliveryEntry
from sluice.egress import Egress, EgressError
from sluice.egress.pacing import DEFAULT_CAP_S, json_seconds

if TYPE_CHECKING:
    from sluice.core.settings import Settings


def _int_or_str(value: str) -> int | str:
    return int(value) if value.lstrip("-").isdigit() else value


def _media_method(force_document: bool, gif_playback: bool) -> tuple[str, str]:
    """The Bot API method and its file field: a document wins over an animation."""
    if force_document:
        return "sendDocument", "document"
    if gif_playback:
        return "sendAnimation", "animation"
    return "sendPhoto", "photo"


class TelegramAdapter:
    name = "telegram"

    def __init__(self, client: Egress, token: str,
                 base_url: str = "https://api.telegram.org",
                 retrier: Retrier | None = None, *, pacing_cap_s: float = DEFAULT_CAP_S) -> None:
        self.client = client
        self.token = token
        self.base_url = base_url.rstrip("/")
        self.retrier = retrier or Retrier()
        self.pacing_cap_s = pacing_cap_s

    def send(self, entry: DeliveryEntry, progress: Progress = NO_PROGRESS) -> str:
        message = message_of(entry)
        texts = [c for part in message.parts
                 for c in chunk(part, TELEGRAM_MAX_TEXT, to_telegram_html)]
        bodies: list[dict[str, Any]] = []
        for text in texts:
            body: dict[str, Any] = {"chat_id": entry.recipient, "text": text,
                                    "parse_mode": "HTML"}
            if message.silent:
                body["disable_notification"] = True
            if message.thread_id:
                body["message_thread_id"] = _int_or_str(message.thread_id)
            bodies.append(body)
        if message.media_url:
            method, field = _media_method(message.force_document, message.gif_playback)
            media: dict[str, Any] = {"chat_id": entry.recipient, field: message.media_url,
                                     "method": method}
            if message.silent:
                media["disable_notification"] = True
            if message.thread_id:
                media["message_thread_id"] = _int_or_str(message.thread_id)
            bodies.insert(0, media)
        if message.reply_to_id and bodies:
            bodies[0]["reply_parameters"] = {"message_id": _int_or_str(message.reply_to_id),
                                             "allow_sending_without_reply": True}
        return send_chunks(bodies, self._post, retrier=self.retrier,
                           label=f"telegram {entry.id}", best_effort=message.best_effort,
                           progress=progress)

    def _post(self, body: dict[str, Any]) -> str:
        body = dict(body)
        method = body.pop("method", "sendMessage")
        try:
            response = self.client.request(
                "POST", f"{self.base_url}/bot{self.token}/{method}", json=body)
        except EgressError as exc:
            # The URL holds the bot token: keep it out of last_error.
            raise transport_error("telegram", exc, redact=self.token) from None
        data = json_of(response)
        if data.get("ok") is True and isinstance(data.get("result"), dict):
            return str(data["result"].get("message_id"))
        status = int(data.get("error_code") or response.status)
        description = str(data.get("description") or f"HTTP {response.status}")
        parameters = data.get("parameters")
        wait = parameters.get("retry_after") if isinstance(parameters, dict) else None
        raise refused(f"telegram {status}: {description}", status=status,
                      pacing=json_seconds(wait, cap_s=self.pacing_cap_s))


def build(settings: Settings, client: Outbound, retrier: Retrier) -> ChannelAdapter | None:
    if not settings.telegram_bot_token:
        return None
    return TelegramAdapter(client.providers, settings.telegram_bot_token, settings.telegram_api_url,
                           retrier, pacing_cap_s=settings.delivery_pacing_cap_s)
