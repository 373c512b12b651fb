"""A tiny SMTP server (RFC 5321 subset) on 127.0.0.1 for the email adapter.

Speaks EHLO/HELO, MAIL FROM, RCPT TO, DATA (dot-unstuffed), RSET, NOOP and QUIT; no
TLS or AUTH. Recipients in ``unknown`` are refused ``550 5.1.1``; those in ``busy``
``451 4.3.0`` (try later). Accepted messages land in ``messages`` as parsed
``email.message.Message`` objects; with ``late_s`` the final reply to DATA comes that
much later (the message is already taken).
"""

from __future__ import annotations

import email
import socketserver
import threading
import time
from email.message import Message
from typing import Self


class SmtpServer:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self.unknown: set[str] = set()
        self.busy: set[str] = set()
        self.late_s = 0.0
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def reply(self, line: str) -> None:
                self.wfile.write(line.encode() + b"\r\n")
                self.wfile.flush()

            def handle(self) -> None:
                self.reply("220 sluice-test ESMTP ready")
                sender, recipients = "", []
                while True:
                    raw = self.rfile.readline()
                    if not raw:
                        return
                    line = raw.decode(errors="replace").rstrip("\r\n")
                    verb = line[:4].upper()
                    if verb == "EHLO":
                        self.reply("250-sluice-test")
                        self.reply("250 8BITMIME")
                    elif verb == "HELO":
                        self.reply("250 sluice-test")
                    elif line.upper().startswith("MAIL FROM:"):
                        sender, recipients = line[10:].strip().split()[0].strip("<>"), []
                        self.reply("250 2.1.0 OK")
                    elif line.upper().startswith("RCPT TO:"):
                        rcpt = line[8:].strip().split()[0].strip("<>")
                        if rcpt in outer.unknown:
                            self.reply("550 5.1.1 user unknown")
                        elif rcpt in outer.busy:
                            self.reply("451 4.3.0 mailbox busy, try again later")
                        else:
                            recipients.append(rcpt)
                            self.reply("250 2.1.5 OK")
                    elif verb == "DATA":
                        if not recipients:
                            self.reply("503 5.5.1 no valid recipients")
                            continue
                        self.reply("354 end data with <CR><LF>.<CR><LF>")
                        lines = []
                        while True:
                            data = self.rfile.readline()
                            if not data or data in (b".\r\n", b".\n"):
                                break
                            lines.append(data[1:] if data.startswith(b"..") else data)
                        outer.messages.append(email.message_from_bytes(b"".join(lines)))
                        outer.envelopes.append((sender, recipients))
                        if outer.late_s:
                            time.sleep(outer.late_s)
                        try:
                            self.reply("250 2.0.0 queued")
                        except OSError:  # the client gave up waiting
                            return
                    elif verb == "RSET":
                        sender, recipients = "", []
                        self.reply("250 2.0.0 OK")
                    elif verb == "NOOP":
                        self.reply("250 2.0.0 OK")
                    elif verb == "QUIT":
                        self.reply("221 2.0.0 bye")
                        return
                    else:
                        self.reply("502 5.5.2 command not recognised")

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        port: int = self.server.server_address[1]
        return port

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
