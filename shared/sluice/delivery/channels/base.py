"""What every channel module shares: typed refusals, chunked sends, and (from
``sluice.delivery.adapter``) the adapter protocol and its registration.

An adapter's ``send(entry, progress)`` returns the platform's message id (several,
comma-joined, when the message went out in chunks) or raises ``PermanentDeliveryError`` (the
platform refused it for good) or ``TransientDeliveryError`` (later), with the
platform's own wait when it gave one; ``OutcomeUnknown`` when the request went out
and no answer came. Each HTTP request or SMTP session goes through the ``Retrier``
(immediate in-process retries). A message in chunks resumes after the chunks its
``progress`` says were accepted (``sluice.delivery.chunks``). Where an entry goes (its
destination, and the receiver whose rates and outages it shares) is decided from its
recipient when it is enqueued (``sluice.delivery.keys``), never by the adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sluice.core.observe import logger
from sluice.delivery.adapter import (
    NO_PROGRESS,
    Channel,
    ChannelAdapter,
    NoProgress,
    Outbound,
    Progress,
    RecipientCheck,
    webhook_guard,
)
from sluice.delivery.classify import (
    CredentialsRefused,
    OutcomeUnknown,
    PermanentDeliveryError,
    TransientDeliveryError,
    classify,
    matches_permanent,
)
from sluice.delivery.payload import Message, parse
from sluice.delivery.retry import Retrier
from sluice.delivery.store import DeliveryEntry
from sluice.egress import Answer, AnswerRefused, DestinationRefused, EgressError, NotSent
from sluice.egress.pacing import Pacing

__all__ = ["CREDENTIAL_STATUSES", "NO_PROGRESS", "RETRYABLE_4XX", "Channel", "ChannelAdapter",
           "NoProgress", "Outbound", "Progress", "RecipientCheck", "json_of", "message_of",
           "refused", "send_chunks", "transient", "transport_error", "webhook_guard"]

# 4xx answers that say "later", not "never".
RETRYABLE_4XX = frozenset({408, 409, 425, 429})
CREDENTIAL_STATUSES = frozenset({401, 403})
T = TypeVar("T")


def refused(text: str, *, status: int | None = None,
            pacing: Pacing | None = None) -> PermanentDeliveryError | TransientDeliveryError:
    """The typed error for a platform's refusal: permanent by pattern (any status) or by a
    final 4xx.

    A 401/403 that names no recipient problem is the receiver refusing Sluice's
    credentials (a wrong token or a rotated signing secret): configuration, not the
    message, so it is transient and the channel's outage rule stops the run before any
    entry loses an attempt. A pacing answer (``sluice.egress.pacing``) says "later": its
    wait when within the cap; past the cap no wait at all, only ``over_cap``.
    """
    # The platform's own words decide first, whatever the status: Telegram answers
    # "bot was blocked" with 403 and has sent such texts with other codes.
    if matches_permanent(text):
        return PermanentDeliveryError(text, status=status)
    if status in CREDENTIAL_STATUSES and pacing is None:
        return CredentialsRefused(text, status=status)
    if pacing is None and (
            status is not None and 400 <= status < 500 and status not in RETRYABLE_4XX):
        return PermanentDeliveryError(text, status=status)
    return transient(text, status=status, pacing=pacing)


def transient(text: str, *, status: int | None = None,
              pacing: Pacing | None = None) -> TransientDeliveryError:
    """A refusal that says "later", with the provider's wait when it gave one within the cap."""
    over = pacing is not None and pacing.over_cap
    return TransientDeliveryError(
        text, status=status, over_cap=over,
        retry_after_s=pacing.wait_s if pacing is not None and not over else None)


def transport_error(label: str, exc: EgressError,
                    redact: str | None = None) -> PermanentDeliveryError | TransientDeliveryError:
    """A refused destination (not a public address, a URL that cannot be parsed) is this
    entry's for good. Not sent (DNS, connect refused or timed out, the deadline gone before
    sending): plain transient. Anything later (no answer by the deadline, an answer that
    could not be read) may have reached the receiver: ``OutcomeUnknown``."""
    text = f"{label}: {exc.message}"
    if redact:
        text = text.replace(redact, "<token>")
    if isinstance(exc, DestinationRefused):
        return PermanentDeliveryError(text)
    if isinstance(exc, NotSent):
        return TransientDeliveryError(text)
    if isinstance(exc, AnswerRefused):
        return OutcomeUnknown(f"{text} (answered; unreadable)")
    return OutcomeUnknown(f"{text} (sent; no answer)")


def json_of(response: Answer) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        data = None
    return data if isinstance(data, dict) else {}


def message_of(entry: DeliveryEntry) -> Message:
    """The entry's payload as a message; one that no longer parses can never be sent."""
    try:
        return parse(entry.channel, entry.payload)
    except Exception as exc:  # noqa: BLE001 - a RequestError from parse, stored before a check
        raise PermanentDeliveryError(f"{entry.channel}: {exc}") from None


def send_chunks(chunks: Sequence[T], send_one: Callable[[T], str], *, retrier: Retrier,
                label: str, best_effort: bool, progress: Progress = NO_PROGRESS) -> str:
    """Send each chunk in order (each with its own in-process retries); the ids, comma-joined.

    A chunk that fails stops the rest and fails the send, except with ``best_effort``,
    where a chunk refused for good is skipped (logged) and the send succeeds if any chunk
    went out. With several chunks, each answer is recorded in ``progress`` before the next
    chunk goes, a chunk ``progress`` already has is not sent again (a retried send resumes
    after it), and every chunk after this send's first takes its own rate slot."""
    done = progress.done() if len(chunks) > 1 else {}
    ids: list[str] = []
    refusals: list[BaseException] = []
    first = True
    for i, item in enumerate(chunks, 1):
        if i in done:
            found = done[i]
            if found is not None:
                ids.append(found)
            continue
        if len(chunks) > 1 and not first:
            progress.slot()  # the first took the send's own slot
        first = False
        part = f"{label} chunk {i}/{len(chunks)}" if len(chunks) > 1 else label
        try:
            message_id = retrier.call(lambda item=item: send_one(item), label=part)  # type: ignore[misc]
        except Exception as exc:
            if not (best_effort and classify(exc) == "permanent"):
                raise
            logger.warning(f"[delivery] {part} refused, skipped (bestEffort): {exc}")
            refusals.append(exc)
            if len(chunks) > 1:
                progress.took(i, None)
            continue
        ids.append(message_id)
        if len(chunks) > 1:
            progress.took(i, message_id)
    if not ids:
        raise refusals[0] if refusals else PermanentDeliveryError(f"{label}: nothing to send")
    return ",".join(ids)
