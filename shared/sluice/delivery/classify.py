"""Delivery errors: the typed pair adapters raise, and the classifier for everything else.

A send fails *permanently* when repeating it cannot help (the chat is gone, the
bot was blocked, the recipient is malformed); anything else is *transient* and is
retried on the schedule. Adapters say which with ``PermanentDeliveryError`` /
``TransientDeliveryError``; errors nobody typed (a driver exception, a string
read back from ``last_error``) are matched against ``PERMANENT_PATTERNS``. When
in doubt, transient: a wrong "transient" costs a few retries, a wrong
"permanent" loses a message. Two more verdicts stop short of judging the entry:
*fatal* (the process ran out of memory: stop the run, leave the entry pending)
and *configuration* (no adapter for the channel: the entry waits for its
credential, no attempt counted).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Literal

from sluice.core.errors import SluiceError

Verdict = Literal["permanent", "transient", "fatal"]
MAX_DEPTH = 10


class DeliveryError(SluiceError):
    """A delivery failed."""

    code = "delivery_error"


class PermanentDeliveryError(DeliveryError):
    """The channel refused the message for good; sending it again will not help."""

    code = "delivery_permanent"


class TransientDeliveryError(DeliveryError):
    """The channel could not take the message now; it is retried on the schedule.

    ``retry_after_s`` is the provider's own wait as ``sluice.egress.pacing`` parsed it
    (finite, never past the cap); ``over_cap`` says it asked for longer than the cap, so
    no wait is honoured (``retry_after_s`` None): the destination is failing instead."""

    code = "delivery_transient"

    def __init__(self, message: str | None = None, *, retry_after_s: float | None = None,
                 over_cap: bool = False, **context: object) -> None:
        super().__init__(message, **context)
        self.retry_after_s = retry_after_s
        self.over_cap = over_cap


class OutcomeUnknown(TransientDeliveryError):
    """The request was sent but no answer came in time: the receiver may have the message.

    Never retried in-process and never failed: the queue resends it (same key) only as its
    channel allows (see ``DeliveryStore.nack``), else it rests ``unknown`` for an operator."""

    code = "delivery_outcome_unknown"


class NoRateSlot(TransientDeliveryError):
    """No rate slot freed in time for a further request of one send (a chunk after the
    first): nothing went out for it. The entry waits for the slot, its attempt given back,
    and resumes where it stopped (``sluice.delivery.chunks``)."""

    code = "delivery_no_rate_slot"


class CredentialsRefused(TransientDeliveryError):
    """The receiver refused Sluice's credentials (401/403: a wrong token, a rotated signing
    secret): configuration, not the message. The channel is set aside for the run and no
    entry loses an attempt."""

    code = "delivery_credentials_refused"


class DestinationDisabled(DeliveryError):
    """A delivery destination was disabled (it answered that it is gone, or failed too long
    without a success): its entries fail ``destination_disabled`` until it is enabled."""

    code = "delivery_destination_disabled"


class MissingAdapter(DeliveryError):
    """No adapter is configured for this entry's channel (configuration, not the entry's fault)."""

    code = "delivery_no_adapter"


class FatalDeliveryError(DeliveryError):
    """The process cannot go on sending (out of memory): the run stops, the entry stays pending."""

    code = "delivery_fatal"


# Case-insensitive; matched anywhere in an error's text, whatever status came with it (a
# 403 "Forbidden: user deactivated" names the recipient, not Sluice's credentials).
# Telegram phrases its errors "Forbidden: bot was blocked by the user", Slack as codes
# ("channel_not_found").
PERMANENT_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"(chat|conversation) not found",
    r"user not found",
    r"bot was blocked",
    r"bot was kicked",
    r"chat_id is empty",
    r"no conversation reference found",
    r"ambiguous.*recipient",
    r"user (is )?deactivated",
    r"message (is )?too long",
    r"invalid format",
    r"bot can't initiate conversation",
    r"bot is not a member",
    r"have no rights to send",
    r"not enough rights",
    r"forbidden\b.*\b(insufficient|not enough)[ _]permissions?",
    r"group chat was upgraded to a supergroup",
    r"message text is empty",
    r"can't parse entities",
    r"\b(channel|user)_not_found\b",
    r"\bnot_in_channel\b",
    r"\bis_archived\b",
    r"\bmsg_too_long\b",
    r"\bno_text\b",
    r"recipient address rejected",
))


# Permanent refusals that say the destination itself is gone, not the message: every entry
# for it would be refused the same way, so the destination is disabled (its entries fail
# ``destination_disabled`` without a request, until an operator enables it). A webhook's
# ``410 Gone`` says it by status.
GONE_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"bot was blocked",
    r"bot was kicked",
    r"chat not found",
    r"\bchannel_not_found\b",
    r"\bis_archived\b",
))
GONE_STATUS = 410


# Errors that say the entry itself is malformed (a recipient URL that does not parse, a
# header with CR/LF): sending it again cannot help, and it says nothing about the
# destination. Matched by class, and by name for the HTTP client's own URL errors, which
# are not ValueErrors and which this module does not import.
MALFORMED_TYPES: tuple[type[BaseException], ...] = (ValueError, TypeError)
MALFORMED_NAMES = frozenset({"InvalidURL", "UnsupportedProtocol", "LocalProtocolError"})


def is_malformed(error: BaseException) -> bool:
    return (isinstance(error, MALFORMED_TYPES) and not isinstance(error, DeliveryError)) or (
        type(error).__name__ in MALFORMED_NAMES)


def matches_permanent(text: str) -> bool:
    return any(pattern.search(text) for pattern in PERMANENT_PATTERNS)


def _children(exc: BaseException) -> Iterator[BaseException]:
    if exc.__cause__ is not None:
        yield exc.__cause__
    if exc.__context__ is not None and not exc.__suppress_context__:
        yield exc.__context__
    if isinstance(exc, BaseExceptionGroup):
        yield from exc.exceptions


def classify(error: BaseException | str) -> Verdict:
    """``permanent`` or ``transient`` for an exception (its whole cause graph) or a message.

    The graph is ``__cause__``, ``__context__`` and the members of exception groups,
    walked with a visited set (cycles end) and a depth limit: a graph deeper than
    ``MAX_DEPTH`` is transient, whatever it holds (fail open: retry rather than drop).
    A ``MemoryError`` anywhere makes it ``fatal``, before anything else.
    A ``TransientDeliveryError`` anywhere wins over permanent evidence elsewhere (an
    adapter said "later" explicitly); otherwise a ``PermanentDeliveryError``, a malformed
    entry (``is_malformed``: a ``ValueError`` such as a recipient URL that does not parse)
    or a node whose text matches ``PERMANENT_PATTERNS`` makes it permanent.
    """
    if isinstance(error, str):
        return "permanent" if matches_permanent(error) else "transient"
    if is_fatal(error):
        return "fatal"
    seen: set[int] = set()
    permanent = False
    stack: list[tuple[BaseException, int]] = [(error, 0)]
    while stack:
        node, depth = stack.pop()
        if id(node) in seen:
            continue
        if depth >= MAX_DEPTH:
            return "transient"
        seen.add(id(node))
        if isinstance(node, TransientDeliveryError):
            return "transient"
        if (isinstance(node, PermanentDeliveryError) or is_malformed(node)
                or matches_permanent(str(node))):
            permanent = True
        stack.extend((child, depth + 1) for child in _children(node))
    return "permanent" if permanent else "transient"


def _walk(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    stack: list[tuple[BaseException, int]] = [(error, 0)]
    while stack:
        node, depth = stack.pop()
        if id(node) in seen or depth >= MAX_DEPTH:
            continue
        seen.add(id(node))
        yield node
        stack.extend((child, depth + 1) for child in _children(node))


def is_fatal(error: BaseException) -> bool:
    """Out of memory anywhere in the cause graph (``MemoryError``, or an adapter's own
    ``FatalDeliveryError``)."""
    return any(isinstance(node, MemoryError | FatalDeliveryError) for node in _walk(error))


def is_unknown(error: BaseException) -> bool:
    """The send may have reached the receiver (timed out after the request went out)."""
    return any(isinstance(node, OutcomeUnknown) for node in _walk(error))


def retry_after_s(error: BaseException) -> float | None:
    """The provider's own wait (Telegram ``retry_after``, Slack ``Retry-After``), if any:
    parsed by ``sluice.egress.pacing``, so finite and never past the cap."""
    for node in _walk(error):
        if isinstance(node, TransientDeliveryError) and node.retry_after_s is not None:
            return node.retry_after_s
    return None


def is_gone(error: BaseException) -> bool:
    """A permanent refusal that says the destination is gone (``410 Gone``, a chat that blocked
    or removed the bot, or does not exist): the destination is disabled, not only the entry
    failed. Only a permanent verdict is read so (a ``410`` behind a transient error is not)."""
    if classify(error) != "permanent":
        return False
    return any(
        (isinstance(node, PermanentDeliveryError) and node.context.get("status") == GONE_STATUS)
        or any(pattern.search(str(node)) for pattern in GONE_PATTERNS)
        for node in _walk(error))


def over_cap(error: BaseException) -> bool:
    """The provider asked to wait longer than the pacing cap: not a wait to honour (no key
    is held for it, no in-process retry waits on it); its destination is failing."""
    return any(isinstance(node, TransientDeliveryError) and node.over_cap
               for node in _walk(error))


def describe(error: BaseException) -> str:
    """One line for ``last_error``: the type and message, with the root cause if different."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    root = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    if root is not None and str(root) and str(root) not in text:
        text += f" (caused by {type(root).__name__}: {root})"
    return text[:2000]
