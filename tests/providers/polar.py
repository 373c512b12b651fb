"""A local stand-in for Polar's event ingestion API (``POST /v1/events/ingest``).

Shape as documented: bearer token; body ``{"events": [{"name", "external_customer_id",
"metadata", "external_id", "timestamp"}]}``; ``200 {"inserted", "duplicates"}`` with
events deduplicated on ``external_id``; ``422 {"detail": [{"loc": ["body", "events",
i, field], "msg", "type"}]}`` when events are invalid (nothing of that request is
stored); metadata keys at most 40 characters, values strings (<= 500), numbers or
booleans, at most 50 pairs. Tests script extra answers (``answers``), add latency,
or mark customers whose events Polar refuses.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import Any

from tests.providers.http import ProviderServer, StandIn, json_response

Answer = tuple[int, dict[str, Any] | str, dict[str, str]]


def _validate(i: int, event: Any, refused_customers: set[str]) -> list[dict[str, Any]]:
    loc = ["body", "events", i]
    if not isinstance(event, dict):
        return [{"loc": loc, "msg": "Input should be an object", "type": "model_type"}]
    errors = []
    if not isinstance(event.get("name"), str) or not event["name"]:
        errors.append({"loc": [*loc, "name"], "msg": "Field required", "type": "missing"})
    customer = event.get("external_customer_id")
    if not isinstance(customer, str) or not customer:
        errors.append({"loc": [*loc, "external_customer_id"], "msg": "Field required",
                       "type": "missing"})
    elif customer in refused_customers:
        errors.append({"loc": [*loc, "external_customer_id"], "msg": "Customer not found",
                       "type": "value_error"})
    metadata = event.get("metadata", {})
    if not isinstance(metadata, dict) or len(metadata) > 50:
        errors.append({"loc": [*loc, "metadata"], "msg": "Invalid metadata", "type": "value_error"})
    else:
        for key, value in metadata.items():
            ok = (len(key) <= 40 and (isinstance(value, (bool, int, float))
                                      or (isinstance(value, str) and len(value) <= 500)))
            if not ok:
                errors.append({"loc": [*loc, "metadata", key], "msg": "Invalid metadata value",
                               "type": "value_error"})
    return errors


class PolarStandIn(StandIn):
    def __init__(self, token: str = "polar-test-token", *, latency_s: float = 0.0) -> None:
        self.token = token
        self.latency_s = latency_s
        self.answers: list[Answer] = []  # scripted answers, used before normal handling
        self.refused_customers: set[str] = set()
        self.events: dict[str, dict[str, Any]] = {}  # external_id -> event
        self.received: Counter[str] = Counter()  # external_id -> times received in a 200
        self.requests = 0
        self.on_request: Any = None  # a callable run as each request arrives (a test's hook)
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self.http = ProviderServer(self._handle)
        # Headers and body go out as two writes: without TCP_NODELAY, Nagle and delayed ACKs
        # add ~40 ms to every keep-alive request and drown the latency being measured.
        self.http.server.RequestHandlerClass.disable_nagle_algorithm = True  # type: ignore[attr-defined]

    def _handle(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            self.requests += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.on_request is not None:
                self.on_request()
            if self.latency_s:
                time.sleep(self.latency_s)
            return self._answer(method, path, headers, body)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _answer(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        if method != "POST" or path.split("?")[0] != "/v1/events/ingest":
            return json_response(404, {"detail": "Not Found"})
        if headers.get("authorization") != f"Bearer {self.token}":
            return json_response(401, {"error": "Unauthorized",
                                       "detail": "Invalid or expired access token"})
        if self.answers:
            status, payload, extra = self.answers.pop(0)
            if isinstance(payload, str):
                return status, {"content-type": "text/plain", **extra}, payload.encode()
            return json_response(status, payload, **extra)
        try:
            data = json.loads(body)
        except ValueError:
            return json_response(422, {"detail": [{"loc": ["body"], "msg": "JSON decode error",
                                                   "type": "json_invalid"}]})
        events = data.get("events") if isinstance(data, dict) else None
        if not isinstance(events, list):
            return json_response(422, {"detail": [{"loc": ["body", "events"],
                                                   "msg": "Field required", "type": "missing"}]})
        errors = [e for i, event in enumerate(events)
                  for e in _validate(i, event, self.refused_customers)]
        if errors:
            return json_response(422, {"detail": errors})
        inserted = duplicates = 0
        with self._lock:
            for event in events:
                key = event.get("external_id") or f"anon-{len(self.events)}"
                self.received[key] += 1
                if key in self.events:
                    duplicates += 1
                else:
                    self.events[key] = event
                    inserted += 1
        return json_response(200, {"inserted": inserted, "duplicates": duplicates})
