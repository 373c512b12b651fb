"""A stand-in for the Lambda runtime API, as AWS documents it: the Runtime API (version
2018-06-01) a runtime client such as ``awslambdaric`` polls, and the extension endpoints
(version 2020-01-01) Sluice's internal extension uses.

Runtime API:

- ``GET /2018-06-01/runtime/invocation/next``: blocks until an event is queued
  (``invoke``), then 200 with the event as the body and the headers
  ``Lambda-Runtime-Aws-Request-Id``, ``Lambda-Runtime-Deadline-Ms``,
  ``Lambda-Runtime-Invoked-Function-Arn`` and ``Lambda-Runtime-Trace-Id``.
- ``POST /2018-06-01/runtime/invocation/{id}/response`` and ``.../{id}/error``: 202, the
  invocation's outcome; an id that was never handed out is 400.
- ``POST /2018-06-01/runtime/init/error``: 202, the init failure (the runtime then exits).

Extensions API:

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
import queue
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from tests.providers.http import ProviderServer, StandIn, json_response

REGISTER = "/2020-01-01/extension/register"
NEXT = "/2020-01-01/extension/event/next"
EVENTS = frozenset({"INVOKE", "SHUTDOWN"})
INVOCATION_NEXT = "/2018-06-01/runtime/invocation/next"
INIT_ERROR = "/2018-06-01/runtime/init/error"
SETTLE = re.compile(r"/2018-06-01/runtime/invocation/([^/]+)/(response|error)")
ACCEPTED = (202, {"content-type": "application/json"}, b'{"status":"OK"}')


class Outcome(NamedTuple):
    """How an invocation (or the init before it) ended, as the runtime client posted it."""

    kind: Literal["response", "error", "init_error"]
    body: Any  # the response, or the error document {errorMessage, errorType, stackTrace}
    error_type: str | None = None  # Lambda-Runtime-Function-Error-Type


class RuntimeApi(StandIn):
    def __init__(self, function_name: str = "sluice-test-fn",
                 handler: str = "functions/cron.handler") -> None:
        self.function_name = function_name
        self.handler = handler
        self.registered: dict[str, dict[str, Any]] = {}  # identifier -> name, events
        self.waiting = threading.Semaphore(0)  # released once per event/next call taken
        self.sigterm_sent = False
        self.gone = threading.Event()
        self._events: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self._handed: set[str] = set()
        self.outcomes: dict[str, Outcome] = {}  # by request id; "init" for an init error
        self._settled = threading.Condition()
        self.http = ProviderServer(self._handle)

    @property
    def address(self) -> str:
        """What Lambda puts in ``AWS_LAMBDA_RUNTIME_API``: host:port, no scheme."""
        return self.http.url.removeprefix("http://")

    def invoke(self, event: Any) -> str:
        """Queue one invocation of ``event``; its request id."""
        request_id = str(uuid.uuid4())
        self._events.put((request_id, json.dumps(event).encode()))
        return request_id

    def outcome(self, request_id: str, timeout: float,
                alive: Callable[[], bool] = lambda: True) -> Outcome | None:
        """The outcome of ``request_id`` (or the init error that came first), waiting at
        most ``timeout`` seconds and no longer than ``alive()`` holds; None if neither came."""
        deadline = time.monotonic() + timeout
        with self._settled:
            while True:
                found = self.outcomes.get(request_id) or self.outcomes.get("init")
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or not alive():
                    return None
                self._settled.wait(min(left, 0.2))

    def _settle(self, key: str, outcome: Outcome) -> tuple[int, dict[str, str], bytes]:
        with self._settled:
            self.outcomes[key] = outcome
            self._settled.notify_all()
        return ACCEPTED

    def _handle(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        if (method, path) == ("GET", INVOCATION_NEXT):
            return self._next_invocation()
        if (method, path) == ("POST", INIT_ERROR):
            return self._settle("init", Outcome("init_error", _json(body),
                                                headers.get("lambda-runtime-function-error-type")))
        settle = SETTLE.fullmatch(path)
        if method == "POST" and settle:
            request_id, kind = settle.groups()
            if request_id not in self._handed:
                return json_response(400, {"errorType": "InvalidRequestID",
                                           "errorMessage": f"unknown request id {request_id}"})
            return self._settle(request_id, Outcome(
                "response" if kind == "response" else "error", _json(body),
                headers.get("lambda-runtime-function-error-type")))
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

    def _next_invocation(self) -> tuple[int, dict[str, str], bytes]:
        while not self.gone.is_set():
            try:
                request_id, event = self._events.get(timeout=0.2)
            except queue.Empty:
                continue
            self._handed.add(request_id)
            arn = f"arn:aws:lambda:eu-north-1:123456789012:function:{self.function_name}"
            return 200, {
                "content-type": "application/json",
                "Lambda-Runtime-Aws-Request-Id": request_id,
                "Lambda-Runtime-Deadline-Ms": str(int(time.time() * 1000) + 300_000),
                "Lambda-Runtime-Invoked-Function-Arn": arn,
                "Lambda-Runtime-Trace-Id": f"Root=1-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:24]}",
            }, event
        return json_response(500, {"errorType": "Runtime.ContainerError",
                                   "errorMessage": "the environment is shutting down"})

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
        return json_response(200, {"functionName": self.function_name,
                                   "functionVersion": "$LATEST", "handler": self.handler},
                             **{"Lambda-Extension-Identifier": identifier})

    def shutdown(self, pid: int) -> None:
        """The Shutdown phase for the runtime process ``pid``."""
        if self.registered:
            self.sigterm_sent = True
            os.kill(pid, signal.SIGTERM)

    def __exit__(self, *exc: object) -> None:
        self.gone.set()
        super().__exit__(*exc)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")
