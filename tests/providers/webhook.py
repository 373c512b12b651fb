"""A webhook receiver built on the ``standardwebhooks`` library (PyPI): it verifies each
request's Standard Webhooks signature and deduplicates on ``webhook-id``.

``received`` keeps every request (with the time it came, ``at``); ``delivered`` keeps one payload per key (what a
receiver that dedupes acts on). A bad or stale signature is ``401``. Tests script
statuses in ``answers`` (e.g. a 503 then a 200; a ``(status, headers)`` pair adds headers,
such as ``Retry-After``), and ``slow`` answers: the request is
taken (counted, and delivered when its scripted status is 200) but the answer waits on
``release`` (an event the test sets), so the sender times out after sending.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError

from tests.providers.http import ProviderServer, StandIn, json_response


def receiver_secret(configured: str) -> str:
    """What the receiver's library takes for a secret Sluice is configured with: the
    ``whsec_`` form as it is, a plain secret as ``whsec_`` + base64 of its bytes."""
    if configured.startswith("whsec_"):
        return configured
    return "whsec_" + base64.b64encode(configured.encode()).decode()


class WebhookReceiver(StandIn):
    PATH = "/hooks/alerts"

    def __init__(self, secret: str, *, port: int = 0) -> None:
        self.secret = secret
        self.verifier = Webhook(receiver_secret(secret))
        self.answers: list[int | tuple[int, dict[str, str]]] = []
        self.received: list[dict[str, Any]] = []
        self.delivered: dict[str, dict[str, Any]] = {}
        self.rejected = 0
        # per path (``/hooks/<name>``), answers scripted for that URL alone (before ``answers``)
        self.scripts: dict[str, list[int | tuple[int, dict[str, str]]]] = {}
        # called with (path, key) as each request arrives, before it is answered: an
        # operator acting in the middle of a drain run
        self.on_request: Callable[[str, str], None] | None = None
        self.slow = 0  # how many of the next requests answer only after ``release`` is set
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.http = ProviderServer(self._handle, port=port)

    def _handle(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        if method != "POST" or not path.startswith("/hooks/"):
            return json_response(404, {"error": "not found"})
        try:
            self.verifier.verify(body, headers)
        except WebhookVerificationError:
            with self._lock:
                self.rejected += 1
            return json_response(401, {"error": "bad signature"})
        key = {k.lower(): v for k, v in headers.items()}.get("webhook-id", "")
        if self.on_request is not None:
            self.on_request(path, key)
        with self._lock:
            self.received.append({"key": key, "headers": headers, "body": json.loads(body),
                                  "at": time.time(), "path": path})
            slow = self.slow > 0
            self.slow -= 1 if slow else 0
            script = self.scripts.get(path)
            if (script or self.answers) and not slow:
                answer = script.pop(0) if script else self.answers.pop(0)
                status, extra = answer if isinstance(answer, tuple) else (answer, {})
                return json_response(status, {"error": "scripted"}, **extra)
            self.delivered.setdefault(key, json.loads(body))
            event_id = f"evt_{list(self.delivered).index(key) + 1}"
        if slow:
            self.release.wait(30)
        return json_response(200, {"id": event_id, "duplicate": len(
            [r for r in self.received if r["key"] == key]) > 1})
