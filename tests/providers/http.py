"""A tiny threaded HTTP server for provider stand-ins (Polar, JWKS, webhooks, ...)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

Handler = Callable[[str, str, dict[str, str], bytes], tuple[int, dict[str, str], bytes]]


class ProviderServer:
    """Serves ``handler(method, path, headers, body) -> (status, headers, body)`` on 127.0.0.1."""

    def __init__(self, handler: Handler, *, port: int = 0) -> None:
        self.requests: list[dict[str, Any]] = []
        self.hangups = 0  # clients that hung up mid-exchange (a killed sender, a timeout)
        outer = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                outer.requests.append({"method": self.command, "path": self.path,
                                       "headers": headers, "body": body})
                status, out_headers, out = handler(self.command, self.path, headers, body)
                self.send_response(status)
                for key, value in out_headers.items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class _Server(ThreadingHTTPServer):
            daemon_threads = True
            # socketserver's default backlog is 5: a burst of new connections past it has
            # its SYNs dropped and retried a second later, which no real provider does
            request_queue_size = 128

            def handle_error(self, request: Any, client_address: Any) -> None:
                if isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
                    outer.hangups += 1  # expected when a test kills or times out its client
                    return
                super().handle_error(request, client_address)

        # port 0: any free one; a given port lets a test bring a receiver back where it was
        self.server = _Server(("127.0.0.1", port), _Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def json_response(status: int, payload: Any, **headers: str) -> tuple[int, dict[str, str], bytes]:
    return status, {"content-type": "application/json", **headers}, json.dumps(payload).encode()


class StandIn:
    """A provider stand-in answering on a ``ProviderServer`` (``self.http``) at ``url``.

    Subclasses set ``self.http`` and, where the provider lives under a path, ``PATH``.
    """

    PATH = ""
    http: ProviderServer

    @property
    def url(self) -> str:
        return self.http.url + self.PATH

    def __enter__(self) -> Self:
        self.http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.__exit__(*exc)
