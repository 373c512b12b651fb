"""What an outbound call can end in, as types the callers branch on.

The one distinction every caller needs is whether the request may have reached the peer:
``NotSent`` (no connection was made: a refused destination, a name that does not resolve,
a refused or timed-out connect, the deadline gone before sending) can be sent again
freely; ``NoAnswer`` (the request went out, or may have, and no complete answer came by
the deadline) may have been acted on, so it is never resent blindly.
"""

from __future__ import annotations

from typing import Any

from sluice.core.errors import RequestError, SluiceError


class EgressError(SluiceError):
    """An outbound call failed."""

    code = "egress_failed"
    status = 502
    sent = False  # whether the peer may have received the request


class NotSent(EgressError):
    """The request never left: no connection was made."""

    code = "not_sent"


class DestinationRefused(NotSent, RequestError):
    """The destination is not one Sluice may call.

    The message never names a resolved address or anything learnt from the target: it
    ends up in ``lastError`` and on the console, where it must not map an internal network.
    """

    code = "address_refused"
    status = 400


class NoAnswer(EgressError):
    """The request went out (or may have); no complete answer came by the deadline."""

    code = "no_answer"
    sent = True


class AnswerRefused(EgressError):
    """The peer answered with something Sluice will not read."""

    code = "answer_refused"
    sent = True

    def __init__(self, message: str | None = None, *, http_status: int | None = None,
                 **context: Any) -> None:
        super().__init__(message, **context)
        self.http_status = http_status


class TooLarge(AnswerRefused):
    """The answer is over the size limit."""

    code = "answer_too_large"


class UnsupportedEncoding(AnswerRefused):
    """The answer uses a content encoding Sluice does not decode (or several stacked)."""

    code = "unsupported_encoding"


class SmtpRefused(EgressError):
    """The SMTP server refused the message or its recipient."""

    code = "smtp_refused"
    sent = True

    def __init__(self, message: str, *, smtp_code: int, stage: str) -> None:
        super().__init__(message)
        self.smtp_code = smtp_code
        self.stage = stage  # "recipient", "data" or "session"


def library_transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP library's own transport errors, for a client library that calls it for us
    (upstash-redis): so its callers need not import the HTTP library themselves."""
    import httpx

    return (httpx.TransportError,)
