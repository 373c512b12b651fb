"""Channel adapters: one ``send(entry) -> platform message id`` each, typed errors out.

An adapter raises ``PermanentDeliveryError`` when the platform refused the message
for good (by the patterns of ``shared.delivery.classify``, or an HTTP 4xx that
repeating cannot fix) and ``TransientDeliveryError`` otherwise, with the
platform's own wait (``retry_after``) when it gave one. Every adapter takes its
client, so tests point it at local stand-ins.

Payloads are JSON objects: ``text`` (Slack, Telegram, email), ``subject`` and
``html`` (email), ``blocks`` / ``threadTs`` (Slack), ``parseMode`` / ``silent``
(Telegram); a webhook receives the whole payload.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import smtplib
import ssl
import time
from collections.abc import Callable, Mapping
from email.message import EmailMessage
from email.utils import make_msgid
from typing import Any, Protocol

import httpx

from shared.core.settings import Settings
from shared.delivery.classify import (
    PermanentDeliveryError,
    TransientDeliveryError,
    matches_permanent,
)
from shared.delivery.store import DeliveryEntry

SIGNATURE_HEADER = "x-sluice-signature"
TIMESTAMP_HEADER = "x-sluice-timestamp"
IDEMPOTENCY_HEADER = "idempotency-key"
# 4xx answers that say "later", not "never".
RETRYABLE_4XX = frozenset({408, 409, 425, 429})


class ChannelAdapter(Protocol):
    name: str

    def send(self, entry: DeliveryEntry) -> str: ...


def refused(text: str, *, status: int | None = None,
            retry_after_s: float | None = None) -> PermanentDeliveryError | TransientDeliveryError:
    """The typed error for a platform's refusal: permanent by pattern or by a final 4xx."""
    if retry_after_s is None and (
            matches_permanent(text)
            or (status is not None and 400 <= status < 500 and status not in RETRYABLE_4XX)):
        return PermanentDeliveryError(text, status=status)
    return TransientDeliveryError(text, retry_after_s=retry_after_s, status=status)


def _text(entry: DeliveryEntry) -> str:
    text = entry.payload.get("text")
    if not isinstance(text, str) or not text:
        raise PermanentDeliveryError(f"{entry.channel}: payload has no text")
    return text


def _retry_after(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        data = None
    return data if isinstance(data, dict) else {}


# --- Signed webhook ------------------------------------------------------------------


def webhook_signature(secret: str, timestamp: str, body: bytes) -> str:
    """``v1=`` + hex HMAC-SHA256 of ``<timestamp>.<body>`` (the timestamp stops replays)."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify_webhook(secret: str, headers: Mapping[str, str], body: bytes, *,
                   now: float | None = None, tolerance_s: float = 300) -> bool:
    """What a receiver runs: the signature matches and the timestamp is recent."""
    timestamp = headers.get(TIMESTAMP_HEADER, "")
    if not timestamp.isdigit() or abs((now or time.time()) - int(timestamp)) > tolerance_s:
        return False
    expected = webhook_signature(secret, timestamp, body)
    return hmac.compare_digest(expected.encode(), headers.get(SIGNATURE_HEADER, "").encode())


class WebhookAdapter:
    """POSTs the payload as JSON to the entry's recipient URL, signed, with an idempotency key
    (a redelivery after a crash carries the same key, so the receiver can drop it)."""

    name = "webhook"

    def __init__(self, client: httpx.Client, secret: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.secret = secret
        self.clock = clock

    def send(self, entry: DeliveryEntry) -> str:
        if not entry.recipient.startswith(("https://", "http://")):
            raise PermanentDeliveryError(f"webhook: recipient is not an http(s) URL: "
                                         f"{entry.recipient[:80]!r}")
        body = json.dumps(entry.payload, separators=(",", ":"), sort_keys=True).encode()
        timestamp = str(int(self.clock()))
        headers = {
            "content-type": "application/json",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: webhook_signature(self.secret, timestamp, body),
            IDEMPOTENCY_HEADER: entry.dedupe_key,
            "x-sluice-delivery-id": entry.id,
            "x-sluice-attempt": str(entry.attempts),
        }
        try:
            response = self.client.post(entry.recipient, content=body, headers=headers)
        except httpx.TransportError as exc:
            raise TransientDeliveryError(f"webhook: {type(exc).__name__}: {exc}") from exc
        if response.is_success:
            found = _json(response).get("id")
            return str(found) if found is not None else entry.dedupe_key
        raise refused(f"webhook answered {response.status_code}: {response.text[:200]}",
                      status=response.status_code,
                      retry_after_s=_retry_after(response.headers.get("retry-after")))


# --- Slack ---------------------------------------------------------------------------


class SlackAdapter:
    """``chat.postMessage`` with a bot token. Slack answers HTTP 200 with ``{"ok": false,
    "error": "channel_not_found"}`` for most errors and 429 with ``Retry-After`` when
    rate limited."""

    name = "slack"

    def __init__(self, client: httpx.Client, token: str,
                 base_url: str = "https://slack.com/api") -> None:
        self.client = client
        self.token = token
        self.base_url = base_url.rstrip("/")

    def send(self, entry: DeliveryEntry) -> str:
        body: dict[str, Any] = {"channel": entry.recipient, "text": _text(entry)}
        if "blocks" in entry.payload:
            body["blocks"] = entry.payload["blocks"]
        if "threadTs" in entry.payload:
            body["thread_ts"] = entry.payload["threadTs"]
        try:
            response = self.client.post(f"{self.base_url}/chat.postMessage", json=body,
                                        headers={"authorization": f"Bearer {self.token}"})
        except httpx.TransportError as exc:
            raise TransientDeliveryError(f"slack: {type(exc).__name__}: {exc}") from exc
        data = _json(response)
        if response.status_code == 429:
            raise TransientDeliveryError(
                "slack: rate_limited",
                retry_after_s=_retry_after(response.headers.get("retry-after")))
        if response.status_code >= 500 or not data:
            raise TransientDeliveryError(f"slack answered {response.status_code}")
        if data.get("ok") is True:
            return f"{data.get('channel', entry.recipient)}:{data.get('ts')}"
        # Slack's 4xx-like answers (invalid_auth, …) come as 200s: only the patterns decide.
        raise refused(f"slack: {data.get('error', 'unknown_error')}")


# --- Telegram ------------------------------------------------------------------------


class TelegramAdapter:
    """Bot API ``sendMessage``. Errors: ``{"ok": false, "error_code": 400, "description":
    "Bad Request: chat not found"}``; 429 carries ``parameters.retry_after``."""

    name = "telegram"

    def __init__(self, client: httpx.Client, token: str,
                 base_url: str = "https://api.telegram.org") -> None:
        self.client = client
        self.token = token
        self.base_url = base_url.rstrip("/")

    def send(self, entry: DeliveryEntry) -> str:
        body: dict[str, Any] = {"chat_id": entry.recipient, "text": _text(entry)}
        if entry.payload.get("parseMode"):
            body["parse_mode"] = entry.payload["parseMode"]
        if entry.payload.get("silent"):
            body["disable_notification"] = True
        try:
            response = self.client.post(f"{self.base_url}/bot{self.token}/sendMessage", json=body)
        except httpx.TransportError as exc:
            # The URL holds the bot token: keep it out of last_error.
            raise TransientDeliveryError(
                f"telegram: {type(exc).__name__}: {str(exc).replace(self.token, '<token>')}"
            ) from None
        data = _json(response)
        if data.get("ok") is True and isinstance(data.get("result"), dict):
            return str(data["result"].get("message_id"))
        status = int(data.get("error_code") or response.status_code)
        description = str(data.get("description") or f"HTTP {response.status_code}")
        parameters = data.get("parameters")
        wait = parameters.get("retry_after") if isinstance(parameters, dict) else None
        if status == 401:  # a wrong token is configuration, not this message's fault
            raise TransientDeliveryError(f"telegram {status}: {description}")
        raise refused(f"telegram {status}: {description}", status=status,
                      retry_after_s=_retry_after(wait))


# --- Email (SMTP) --------------------------------------------------------------------


class EmailAdapter:
    """One message per entry over SMTP; the recipient is the address. A 5xx refusal of the
    recipient or the data is permanent; anything else (4xx, a dropped connection) is not."""

    name = "email"

    def __init__(self, connect: Callable[[], smtplib.SMTP], sender: str) -> None:
        self.connect = connect
        self.sender = sender

    def send(self, entry: DeliveryEntry) -> str:
        text = entry.payload.get("text")
        html = entry.payload.get("html")
        if not (isinstance(text, str) and text) and not (isinstance(html, str) and html):
            raise PermanentDeliveryError("email: payload has no text or html")
        if "@" not in entry.recipient:
            raise PermanentDeliveryError(f"email: recipient address rejected: "
                                         f"{entry.recipient[:80]!r} is not an address")
        message = EmailMessage()
        message["From"] = self.sender
        message["To"] = entry.recipient
        message["Subject"] = str(entry.payload.get("subject") or "(no subject)")
        message["Message-ID"] = make_msgid(idstring=entry.id.replace("-", ""),
                                           domain=self.sender.rpartition("@")[2] or None)
        message["X-Sluice-Delivery-Id"] = entry.id
        message["Idempotency-Key"] = entry.dedupe_key
        message.set_content(text if isinstance(text, str) and text else "")
        if isinstance(html, str) and html:
            message.add_alternative(html, subtype="html")
        try:
            with self.connect() as smtp:
                smtp.send_message(message)
        except smtplib.SMTPRecipientsRefused as exc:
            code, reply = next(iter(exc.recipients.values()), (0, b""))
            text_reply = reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)
            error = f"email: recipient address rejected: {code} {text_reply}"
            raise (PermanentDeliveryError(error) if code >= 500
                   else TransientDeliveryError(error)) from exc
        except smtplib.SMTPDataError as exc:
            error = f"email: data refused: {exc.smtp_code} {exc.smtp_error!r}"
            raise (PermanentDeliveryError(error) if exc.smtp_code >= 500
                   else TransientDeliveryError(error)) from exc
        except (smtplib.SMTPException, OSError) as exc:
            raise TransientDeliveryError(f"email: {type(exc).__name__}: {exc}") from exc
        return str(message["Message-ID"])


def smtp_connector(settings: Settings) -> Callable[[], smtplib.SMTP]:
    host, port, timeout = settings.smtp_host or "", settings.smtp_port, settings.delivery_send_timeout_s

    def connect() -> smtplib.SMTP:
        smtp: smtplib.SMTP
        if settings.smtp_security == "ssl":
            smtp = smtplib.SMTP_SSL(host, port, timeout=timeout,
                                    context=ssl.create_default_context())
        else:
            smtp = smtplib.SMTP(host, port, timeout=timeout)
            if settings.smtp_security == "starttls":
                smtp.starttls(context=ssl.create_default_context())
        if settings.smtp_username and settings.smtp_password:
            smtp.login(settings.smtp_username, settings.smtp_password)
        return smtp

    return connect


def build_adapters(settings: Settings, client: httpx.Client) -> dict[str, ChannelAdapter]:
    """The adapters whose credentials are configured; an entry for any other channel fails
    as ``MissingAdapter``."""
    adapters: dict[str, ChannelAdapter] = {}
    if settings.webhook_signing_secret:
        adapters["webhook"] = WebhookAdapter(client, settings.webhook_signing_secret)
    if settings.slack_bot_token:
        adapters["slack"] = SlackAdapter(client, settings.slack_bot_token, settings.slack_api_url)
    if settings.telegram_bot_token:
        adapters["telegram"] = TelegramAdapter(client, settings.telegram_bot_token,
                                               settings.telegram_api_url)
    if settings.smtp_host and settings.smtp_from:
        adapters["email"] = EmailAdapter(smtp_connector(settings), settings.smtp_from)
    return adapters


# Every channel Sluice can send on, by name: the one list that commands and checks read.
CHANNELS: dict[str, type] = {
    adapter.name: adapter for adapter in (WebhookAdapter, SlackAdapter, TelegramAdapter,
                                          EmailAdapter)
}
