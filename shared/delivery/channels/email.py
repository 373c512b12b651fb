"""The ``email`` channel: one SMTP message per entry; the recipient is the address.

The parts are joined (blank line between) into one message, never chunked:
``text/plain`` with the marks removed and ``text/html`` (the payload's ``html``, else
the parts converted: paragraphs, ``<b>``, ``<code>``, escaped). ``subject`` is the
subject; ``replyToId`` becomes ``In-Reply-To`` and, with ``threadId``, ``References``
(a Message-ID each); ``accountId`` and ``silent`` are ignored. A 5xx refusal of the
recipient or the data is permanent; anything else (4xx, a dropped connection) is not.
"""

from __future__ import annotations

import contextlib
import smtplib
import ssl
from collections.abc import Callable
from email.message import EmailMessage
from email.utils import make_msgid
from typing import TYPE_CHECKING

import httpx

from shared.delivery.channels.base import Channel, ChannelAdapter, message_of
from shared.delivery.chunking import plain, to_html
from shared.delivery.classify import (
    OutcomeUnknown,
    PermanentDeliveryError,
    TransientDeliveryError,
)
from shared.delivery.retry import Retrier
from shared.delivery.store import DeliveryEntry

if TYPE_CHECKING:
    from shared.core.settings import Settings


class EmailAdapter:
    name = "email"

    def __init__(self, connect: Callable[[], smtplib.SMTP], sender: str,
                 retrier: Retrier | None = None, server: str = "smtp") -> None:
        self.connect = connect
        self.sender = sender
        self.retrier = retrier or Retrier()
        self.server = server

    def outage_key(self, entry: DeliveryEntry) -> str:
        return f"email:{self.server}"

    def send(self, entry: DeliveryEntry) -> str:
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
            smtp = self.connect()
        except (smtplib.SMTPException, OSError) as exc:  # not connected: nothing was sent
            raise TransientDeliveryError(f"email: {type(exc).__name__}: {exc}") from exc
        try:
            smtp.send_message(mail)
        except (TimeoutError, smtplib.SMTPServerDisconnected) as exc:
            smtp.close()
            # The message may have been taken before the answer was lost.
            raise OutcomeUnknown(f"email: {type(exc).__name__}: {exc} (sent; no answer)") \
                from exc
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
        finally:
            if smtp.sock is not None:
                with contextlib.suppress(smtplib.SMTPException, OSError):
                    smtp.quit()


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


def build(settings: Settings, client: httpx.Client, retrier: Retrier) -> ChannelAdapter | None:
    if not (settings.smtp_host and settings.smtp_from):
        return None
    return EmailAdapter(smtp_connector(settings), settings.smtp_from, retrier,
                        server=f"{settings.smtp_host}:{settings.smtp_port}")


CHANNEL = Channel("email", "an email address", build)
