"""SMTP sessions that end by their deadline, with refusals as typed errors.

``smtplib`` times each socket operation; a server that answers one byte a second holds a
session for hours. Here each command's wait is cut to the time left, and a watchdog
shuts the socket down at the deadline, which ends any wait (a TLS handshake or a reply
line that trickles) at once. The server's name is resolved under the deadline too.

Whether the message may have been delivered decides the error: anything before the
end of ``DATA`` is ``NotSent``; a session that breaks or times out after the message's
final ``.`` was sent is ``NoAnswer`` (the server may have queued it).
"""

from __future__ import annotations

import smtplib
import socket
import ssl
import threading
import time
from email.message import EmailMessage
from typing import TYPE_CHECKING, Literal, NamedTuple

from sluice.egress.errors import NoAnswer, NotSent, SmtpRefused
from sluice.egress.guard import AddressGuard, trusted
from sluice.egress.tls import tls_context

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

Security = Literal["starttls", "ssl", "none"]


class SmtpServer(NamedTuple):
    host: str
    port: int
    security: Security = "starttls"
    username: str | None = None
    password: str | None = None
    timeout_s: float = 10.0


class _Smtp(smtplib.SMTP):
    """Every command waits at most the time left; ``ssl_context``: TLS from the start."""

    def __init__(self, stop_at: float, guard: AddressGuard, timeout: float,
                 ssl_context: ssl.SSLContext | None) -> None:
        self.stop_at = stop_at
        self.guard = guard
        self.ssl_context = ssl_context
        self.final_dot_sent = False
        super().__init__(timeout=timeout)

    def _left(self) -> float:
        left = self.stop_at - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline passed")
        return min(self.timeout, left)

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        address = self.guard.addresses(host, port, self._left())[0]
        sock = socket.create_connection((address, port), self._left())
        if self.ssl_context is not None:
            return self.ssl_context.wrap_socket(sock, server_hostname=host)
        return sock

    def send(self, s: ReadableBuffer | str) -> None:
        if self.sock is not None:
            self.sock.settimeout(self._left())
        data = s.encode("ascii") if isinstance(s, str) else bytes(s)
        if data.endswith(b"\r\n.\r\n"):
            self.final_dot_sent = True  # from here on the server may accept the message
        super().send(s)

    def getreply(self) -> tuple[int, bytes]:
        if self.sock is not None:
            self.sock.settimeout(self._left())
        return super().getreply()


def send_mail(server: SmtpServer, mail: EmailMessage, *, deadline: float | None = None,
              guard: AddressGuard | None = None) -> None:
    """One session: connect, (STARTTLS, login,) send ``mail``, quit; ended by ``deadline``
    (``time.monotonic`` seconds) or ``server.timeout_s`` from now, whichever is first."""
    stop_at = time.monotonic() + server.timeout_s
    stop_at = stop_at if deadline is None else min(stop_at, deadline)
    smtp = _Smtp(stop_at, guard or trusted(), server.timeout_s,
                 tls_context() if server.security == "ssl" else None)
    watchdog = threading.Timer(max(0.0, stop_at - time.monotonic()), _cut, (smtp,))
    watchdog.daemon = True
    watchdog.start()
    connected = False
    try:
        smtp.connect(server.host, server.port)
        connected = True
        if server.security == "starttls":
            smtp.starttls(context=tls_context())
        if server.username and server.password:
            smtp.login(server.username, server.password)
        smtp.send_message(mail)
        try:
            smtp.quit()
        except (smtplib.SMTPException, OSError):
            pass  # the message was accepted; a lost goodbye changes nothing
    except smtplib.SMTPRecipientsRefused as exc:
        code, reply = next(iter(exc.recipients.values()), (0, b""))
        raise SmtpRefused(f"recipient address rejected: {code} {_text(reply)}",
                          smtp_code=code, stage="recipient") from None
    except smtplib.SMTPDataError as exc:
        raise SmtpRefused(f"data refused: {exc.smtp_code} {_text(exc.smtp_error)}",
                          smtp_code=exc.smtp_code, stage="data") from None
    except smtplib.SMTPResponseException as exc:
        raise SmtpRefused(f"{type(exc).__name__}: {exc.smtp_code} {_text(exc.smtp_error)}",
                          smtp_code=exc.smtp_code, stage="session") from None
    except (smtplib.SMTPException, OSError) as exc:
        why = "no answer by the deadline" if time.monotonic() >= stop_at else _describe(exc)
        if smtp.final_dot_sent:
            raise NoAnswer(f"smtp: {why} (sent; no answer)") from None
        raise NotSent(f"smtp: {why}" + ("" if connected else " (connecting)")) from None
    finally:
        watchdog.cancel()
        smtp.close()


def _cut(smtp: smtplib.SMTP) -> None:
    sock = smtp.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _text(reply: bytes | str) -> str:
    return reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
