"""SMTP sessions end by their deadline whatever the server does (a greeting trickled byte by
byte, a server that never answers, one that goes quiet after the message), and say whether
the message may have been delivered."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from email.message import EmailMessage

import pytest

from sluice.egress import NoAnswer, NotSent
from sluice.egress.smtp import SmtpServer, send_mail

DEADLINE_S = 1.0
SLACK_S = 3.0  # a busy two-core machine: generous, still far below "forever"


class SlowSmtp:
    """``mode``: ``trickle`` (the greeting, a byte at a time, forever), ``silent`` (accepts,
    never speaks), ``quiet-after-data`` (a normal session until the final dot, then nothing)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.stop = threading.Event()
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                try:
                    outer.serve(self.connection, self.rfile)
                except OSError:
                    pass

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]

    def serve(self, conn: socket.socket, rfile: object) -> None:
        if self.mode == "silent":
            self.stop.wait(30)
            return
        if self.mode == "trickle":
            while not self.stop.wait(0.05):
                conn.sendall(b"2")
            return
        reader = rfile
        conn.sendall(b"220 slow.test ESMTP\r\n")
        in_data = False
        while not self.stop.is_set():
            line = reader.readline()  # type: ignore[attr-defined]
            if not line:
                return
            if in_data:
                if line == b".\r\n":
                    self.stop.wait(30)  # the message is in; the answer never comes
                    return
                continue
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                conn.sendall(b"250 slow.test\r\n")
            elif verb == b"DATA":
                conn.sendall(b"354 go ahead\r\n")
                in_data = True
            else:
                conn.sendall(b"250 ok\r\n")

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def mail() -> EmailMessage:
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "a@sluice.test", "b@sluice.test", "hi"
    message.set_content("hello")
    return message


@pytest.fixture(params=["trickle", "silent", "quiet-after-data"])
def slow(request: pytest.FixtureRequest) -> Iterator[SlowSmtp]:
    server = SlowSmtp(request.param)
    yield server
    server.close()


def test_every_smtp_session_ends_by_its_deadline(slow: SlowSmtp, mail: EmailMessage) -> None:
    server = SmtpServer("127.0.0.1", slow.port, "none", timeout_s=DEADLINE_S)
    started = time.monotonic()
    with pytest.raises(NoAnswer if slow.mode == "quiet-after-data" else NotSent) as caught:
        send_mail(server, mail)
    elapsed = time.monotonic() - started
    assert elapsed < DEADLINE_S + SLACK_S, elapsed
    # only a session that sent the final dot may have delivered: that is "sent; no answer"
    assert caught.value.sent is (slow.mode == "quiet-after-data")
