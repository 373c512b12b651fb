"""The one way out: every outbound HTTP and SMTP call of Sluice goes through here.

``Egress`` (HTTP) and ``send_mail`` (SMTP) end every call by its deadline, read answers
with a cap on decoded bytes, and check destinations named in data with an
``AddressGuard``. Failures are ``sluice.egress.errors`` types; no other package imports
an HTTP or SMTP library (an import-linter contract).
"""

from __future__ import annotations

from sluice.egress.client import ANSWER_BYTES, Answer, Egress
from sluice.egress.errors import (
    AnswerRefused,
    DestinationRefused,
    EgressError,
    NoAnswer,
    NotSent,
    SmtpRefused,
    TooLarge,
    UnsupportedEncoding,
)
from sluice.egress.guard import AddressGuard, Resolver, refusal, system_resolver, trusted

__all__ = ["ANSWER_BYTES", "AddressGuard", "Answer", "AnswerRefused", "DestinationRefused",
           "Egress", "EgressError", "NoAnswer", "NotSent", "Resolver", "SmtpRefused",
           "TooLarge", "UnsupportedEncoding", "refusal", "system_resolver", "trusted"]
