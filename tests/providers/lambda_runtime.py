"""A stand-in for the Lambda runtime API's extension endpoints, as the Extensions API
reference documents them (version 2020-01-01).

- ``POST /2020-01-01/extension/register``: ``Lambda-Extension-Name`` required; a body
  ``{"events": [...]}`` of ``INVOKE`` / ``SHUTDOWN``. Every extension registered here is an
  internal one (the stand-in has no files under /opt/extensions), and internal extensions
  are not permitted to register for ``SHUTDOWN``: that is refused (403). On success, 200
  with ``Lambda-Extension-Identifier`` and the function's name, version and handler.
- ``GET /2020-01-01/extension/event/next`` with that identifier (403 without): blocks.
  Lambda sends an internal extension no ``SHUTDOWN``, so with no events the call stays
  open until the environment goes (then the stand-in answers 500, "container error").

``shutdown(pid)`` is the Shutdown phase: Lambda sends the runtime process SIGTERM when the
function has an extension registered, and otherwise lets the runtime go without it
(``sigterm_sent`` records which).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from typing import Any

from tests.providers.http import ProviderServer, StandIn, json_response

REGISTER = "/2020-01-01/extension/register"
NEXT = "/2020-01-01/extension/event/next"
EVENTS = frozenset({"INVOKE", "SHUTDOWN"})


class RuntimeApi(StandIn):
    def __init__(self) -> None:
        self.registered: dict[str, dict[str, Any]] = {}  # identifier -> name, events
        self.waiting = threading.Semaphore(0)  # released once per event/next call taken
        self.sigterm_sent = False
        self.gone = threading.Event()
        self.http = ProviderServer(self._handle)

    @property
    def address(self) -> str:
        """What Lambda puts in ``AWS_LAMBDA_RUNTIME_API``: host:port, no scheme."""
        return self.http.url.removeprefix("http://")

    def _handle(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        if (method, path) == ("POST", REGISTER):
            return self._register(headers, body)
        if (method, path) == ("GET", NEXT):
            if headers.get("lambda-extension-identifier") not in self.registered:
                return json_response(403, {"errorType": "Extension.UnknownExtensionIdentifier",
                                           "errorMessage": "unknown extension"})
            self.waiting.release()
            self.gone.wait()
            return json_response(500, {"errorType": "Extension.ContainerError",
                                       "errorMessage": "the environment is shutting down"})
        return json_response(404, {"errorMessage": f"no route {method} {path}"})

    def _register(self, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str],
                                                                          bytes]:
        name = headers.get("lambda-extension-name")
        try:
            events = json.loads(body or b"{}").get("events", [])
        except (ValueError, AttributeError):
            events = None
        if not name or not isinstance(events, list) or not set(events) <= EVENTS:
            return json_response(400, {"errorType": "InvalidRequest",
                                       "errorMessage": "name header and INVOKE/SHUTDOWN events"})
        if "SHUTDOWN" in events:
            return json_response(403, {
                "errorType": "ShutdownEventNotSupportedForInternalExtension",
                "errorMessage": f"{name}: internal extensions cannot register for SHUTDOWN"})
        identifier = str(uuid.uuid4())
        self.registered[identifier] = {"name": name, "events": events}
        return json_response(200, {"functionName": "sluice-test-fn", "functionVersion": "$LATEST",
                                   "handler": "functions/cron.handler"},
                             **{"Lambda-Extension-Identifier": identifier})

    def shutdown(self, pid: int) -> None:
        """The Shutdown phase for the runtime process ``pid``."""
        if self.registered:
            self.sigterm_sent = True
            os.kill(pid, signal.SIGTERM)

    def __exit__(self, *exc: object) -> None:
        self.gone.set()
        super().__exit__(*exc)
