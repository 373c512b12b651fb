"""The ``email`` channel: one SMTP message per entry; the recipient is the address.

The parts are joined (blank line between) into one message, never chunked:
``text/plain`` with the marks removed and ``text/html`` (the payload's ``html``, else
the parts converted: paragraphs, ``<b>``, ``<code>``, escaped). ``subject`` is the
subject; ``replyToId`` becomes ``In-Reply-To`` and, with ``threadId``, ``References``
(a Message-ID each); ``accountId`` and ``silent`` are ignored. A 5xx refusal of the
recipient or the data is permanent; anything else (4xx, a dropped connection) is not.
"""

from __future__ import annotations

from email.message import EmailMessage
from email.utils import make_msgid
from typing import TYPE_CHECKING

from sluice.delivery.channels.base import (
    NO_PROGRESS,
    ChannelAdapter,
    Outbound,
    Progress,
    message_of,
    transport_error,
)
from sluice.delivery.chunking import plain, to_html
from sluice.delivery.classify import (
    PermanentDeliveryError,
    TransientDeliveryError,
)
from sluice.delivery.retry import Retrier
from sluice.delivery.store import DeliveryEntry
from sluice.egress import EgressError, SmtpRefused
from sluice.egress.smtp import SmtpServer, send_mail

if TYPE_CHECKING:
    from sluice.core.settings import Settings


class EmailAdapter:
    name = "email"

    def __init__(self, server: SmtpServer, sender: str, retrier: Retrier | None = None,
                 deadline: float | None = None) -> None:
        self.server = server
        self.sender = sender
        self.retrier = retrier or Retrier()
        self.deadline = deadline

    def send(self, entry: DeliveryEntry, progress: Progress = NO_PROGRESS) -> str:
        message = message_of(entry)
        if "@" not in entry.recipient:
            raise PermanentDeliveryError(f"email: recipient address rejected: "
                                         f"{entry.recipient[:80]!r} is not an address")
        text = "\n\n".join(message.parts)
        mail = EmailMessage()
        mail["From"] = self.sender
        mail["To"] = entry.recipient
        mail["Subject"] = message.subject or "(no subject)"
        mail["Message-ID"] = make_msgid(idstring=entry.id.replace("-", ""),
                                        domain=self.sender.rpartition("@")[2] or None)
        mail["X-Sluice-Delivery-Id"] = entry.id
        mail["Idempotency-Key"] = entry.dedupe_key
        if message.reply_to_id:
            mail["In-Reply-To"] = message.reply_to_id
        references = " ".join(r for r in (message.thread_id, message.reply_to_id) if r)
        if references:
            mail["References"] = references
        mail.set_content(plain(text))
        html = message.html or (to_html(text) if text else None)
        if html:
            mail.add_alternative(html, subtype="html")
        self.retrier.call(lambda: self._deliver(mail), label=f"email {entry.id}")
        return str(mail["Message-ID"])

    def _deliver(self, mail: EmailMessage) -> None:
        try:
            send_mail(self.server, mail, deadline=self.deadline)
        except SmtpRefused as exc:
            error = f"email: {exc.message}"
            about_it = exc.stage in ("recipient", "data")  # the relay answered this message
            if exc.smtp_code >= 500 and about_it:
                raise PermanentDeliveryError(error) from None
            # an answer about this message is its own failure; a refused session the relay's
            raise (TransientDeliveryError(error, status=exc.smtp_code) if about_it
                   else TransientDeliveryError(error)) from None
        except EgressError as exc:
            raise transport_error("email", exc) from None


def smtp_server(settings: Settings) -> SmtpServer:
    return SmtpServer(settings.smtp_host or "", settings.smtp_port, settings.smtp_security,
                      settings.smtp_username, settings.smtp_password,
                      settings.delivery_send_timeout_s)


def build(settings: Settings, client: Outbound, retrier: Retrier) -> ChannelAdapter | None:
    if not (settings.smtp_host and settings.smtp_from):
        return None
    return EmailAdapter(smtp_server(settings), settings.smtp_from, retrier, client.deadline)
