"""The delivery payload: a list of parts plus the addressing options, checked at enqueue.

A payload is a JSON object::

    {"payloads": ["first part", {"text": "second part"}],
     "accountId": "…", "threadId": "…", "replyToId": "…",
     "silent": false, "bestEffort": false,
     "gifPlayback": false, "forceDocument": false,
     "mirror": false, "gatewayClientScopes": ["…"],
     "mediaUrl": "https://…",              # telegram: a file sent before the text
     "subject": "…", "html": "…",          # email
     "blocks": [...]}                      # slack, sent with the first chunk

``gifPlayback`` and ``forceDocument`` choose how Telegram sends ``mediaUrl`` (an
animation, or a document rather than a photo); no other channel sends media, so they
are stored and ignored there. ``mirror`` and ``gatewayClientScopes`` are kept with the
entry for the producer's own bookkeeping (transcript mirroring, gateway scopes belong to
the producer) and no channel reads them.
``text`` (one string) is still accepted and is the same as ``payloads: [text]``.
Each part's text is plain text with two marks, ``**bold**`` and ```code```, which
each channel converts to its own markup (``sluice.delivery.chunking``). Any other key
is refused with a 400 naming it, except for ``webhook``, whose receiver gets the
payload as it is (so it may carry anything).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sluice.core.errors import RequestError
from sluice.core.validate import MAX_MESSAGE, check_identifier, check_text, check_url

COMMON_KEYS = frozenset({"payloads", "text", "accountId", "threadId", "replyToId", "silent",
                         "bestEffort", "gifPlayback", "forceDocument", "mirror",
                         "gatewayClientScopes"})
CHANNEL_KEYS: dict[str, frozenset[str]] = {
    "email": frozenset({"subject", "html"}),
    "slack": frozenset({"blocks"}),
    "telegram": frozenset({"mediaUrl"}),
}
MAX_SCOPES = 50
FREE_FORM = frozenset({"webhook"})
MAX_PARTS = 100
MAX_SLACK_BLOCKS = 50


class Message(NamedTuple):
    parts: tuple[str, ...]
    account_id: str | None = None
    thread_id: str | None = None
    reply_to_id: str | None = None
    silent: bool = False
    best_effort: bool = False
    subject: str | None = None
    html: str | None = None
    blocks: tuple[dict[str, Any], ...] = ()
    gif_playback: bool = False
    force_document: bool = False
    mirror: bool = False
    gateway_client_scopes: tuple[str, ...] = ()
    media_url: str | None = None


def _optional_id(payload: dict[str, Any], key: str) -> str | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # Telegram ids are numbers
    return check_identifier(value, field=key)


def _optional_text(payload: dict[str, Any], key: str, *, multiline: bool) -> str | None:
    value = payload.get(key)
    if value is None:
        return None
    return check_text(value, field=key, limit=MAX_MESSAGE, multiline=multiline)


def _flag(payload: dict[str, Any], key: str) -> bool:
    value = payload.get(key, False)
    if not isinstance(value, bool):
        raise RequestError(f"payload.{key} must be true or false", field=key)
    return value


def _scopes(payload: dict[str, Any]) -> tuple[str, ...]:
    raw = payload.get("gatewayClientScopes", [])
    if not isinstance(raw, list) or len(raw) > MAX_SCOPES \
            or not all(isinstance(x, str) and x for x in raw):
        raise RequestError(f"payload.gatewayClientScopes must be a list of at most {MAX_SCOPES} "
                           "non-empty strings", field="gatewayClientScopes")
    return tuple(raw)


def _media_url(payload: dict[str, Any]) -> str | None:
    raw = payload.get("mediaUrl")
    if raw is None:
        return None
    url = check_url(raw, field="mediaUrl")
    # Telegram's servers fetch it, never Sluice: only its form is checked here.
    if not url.startswith("https://"):
        raise RequestError("payload.mediaUrl must be an https:// URL", field="mediaUrl")
    return url


def _parts(payload: dict[str, Any]) -> tuple[str, ...]:
    if "payloads" in payload and "text" in payload:
        raise RequestError("give payload.payloads or payload.text, not both", field="text")
    raw = payload.get("payloads")
    if raw is None:
        raw = [payload["text"]] if "text" in payload else []
    if not isinstance(raw, list) or len(raw) > MAX_PARTS:
        raise RequestError(f"payload.payloads must be a list of at most {MAX_PARTS} parts",
                           field="payloads")
    parts = []
    for i, part in enumerate(raw):
        if isinstance(part, dict):
            extra = sorted(set(part) - {"text"})
            if extra:
                raise RequestError(f"payload.payloads[{i}].{extra[0]} is not supported",
                                   field=f"payloads[{i}].{extra[0]}")
            part = part.get("text")
        if not isinstance(part, str):
            raise RequestError(f"payload.payloads[{i}] must be a string or {{\"text\": …}}",
                               field=f"payloads[{i}]")
        if part.strip():
            parts.append(check_text(part, field=f"payloads[{i}]", limit=MAX_MESSAGE,
                                    multiline=True))
    return tuple(parts)


def parse(channel: str, payload: Any) -> Message:
    """The message a channel sends; ``RequestError`` (400) naming the first bad key."""
    if not isinstance(payload, dict):
        raise RequestError("payload must be a JSON object", field="payload")
    if channel in FREE_FORM:
        # Its receiver gets the object as it is: a key named like an option (an event's own
        # ``accountId``, ``silent`` or ``payloads``) is the receiver's data, not one to check.
        return Message(parts=())
    allowed = COMMON_KEYS | CHANNEL_KEYS.get(channel, frozenset())
    unknown = sorted(set(payload) - allowed)
    if unknown:
        raise RequestError(f"payload.{unknown[0]} is not supported by the {channel} channel",
                           field=unknown[0])
    parts = _parts(payload)
    html = _optional_text(payload, "html", multiline=True) if channel == "email" else None
    blocks = payload.get("blocks", []) if channel == "slack" else []
    if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks) \
            or len(blocks) > MAX_SLACK_BLOCKS:
        raise RequestError(f"payload.blocks must be a list of at most {MAX_SLACK_BLOCKS} "
                           "block objects", field="blocks")
    media_url = _media_url(payload) if channel == "telegram" else None
    if not parts and not html and not blocks and not media_url:
        raise RequestError("payload has no text: give payload.payloads (or payload.text)",
                           field="payloads")
    return Message(
        parts=parts,
        account_id=_optional_id(payload, "accountId"),
        thread_id=_optional_id(payload, "threadId"),
        reply_to_id=_optional_id(payload, "replyToId"),
        silent=_flag(payload, "silent"),
        best_effort=_flag(payload, "bestEffort"),
        # A header: one line, so no CR/LF ever reaches the message's headers.
        subject=_optional_text(payload, "subject", multiline=False) if channel == "email"
        else None,
        html=html,
        blocks=tuple(blocks),
        gif_playback=_flag(payload, "gifPlayback"),
        force_document=_flag(payload, "forceDocument"),
        mirror=_flag(payload, "mirror"),
        gateway_client_scopes=_scopes(payload),
        media_url=media_url,
    )
