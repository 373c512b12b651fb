"""Polar's event ingestion API: the client, and how its answers are judged.

``POST {api_url}/v1/events/ingest`` with ``{"events": [...]}``; each event's
``external_id`` is the outbox row id, which Polar deduplicates on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sluice.billing.usage import iso
from sluice.egress import Answer, Egress, EgressError, NotSent

INGEST_PATH = "/v1/events/ingest"
TRANSIENT_STATUSES = frozenset({408, 425, 429})

AUTH_STATUSES = frozenset({401, 403})

# "unauthorized" is Sluice's configuration being wrong, not the rows: they keep their
# attempts and the run stops, instead of burning every row as a permanent 4xx would.
Verdict = Literal["ok", "transient", "permanent", "unauthorized"]


def classify(status: int) -> Verdict:
    """How a Polar HTTP status settles the rows it answered for."""
    if 200 <= status < 300:
        return "ok"
    if status in AUTH_STATUSES:
        return "unauthorized"
    if status in TRANSIENT_STATUSES or status >= 500:
        return "transient"
    return "permanent"


def retry_after_seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return 0.0  # an HTTP date: still a request to back off


@dataclass(frozen=True)
class IngestOutcome:
    verdict: Verdict
    status: int | None = None  # None: no answer (network error)
    error: str | None = None
    retry_after: float | None = None
    event_errors: dict[int, str] = field(default_factory=dict)  # index in the request -> error
    reached: bool = True  # False: the request never reached Polar (no connection)

    def judged(self) -> bool:
        """Whether Polar may have judged the events: a 5xx, or a timeout once sent."""
        return (self.reached and self.verdict == "transient" and self.status != 429
                and self.retry_after is None)


class PolarClient:
    """``POST {api_url}/v1/events/ingest`` with a bearer token, over a given egress client
    (trusted: the URL is the operator's; still under the deadline and the answer cap)."""

    def __init__(self, api_url: str, token: str, *, client: Egress) -> None:
        self.url = api_url.rstrip("/") + INGEST_PATH
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.client = client

    def ingest(self, events: list[dict[str, Any]]) -> IngestOutcome:
        try:
            response = self.client.request("POST", self.url, json={"events": events},
                                           headers=self.headers)
        except EgressError as exc:
            return IngestOutcome("transient", error=f"network: {exc.message}",
                                 reached=not isinstance(exc, NotSent))
        verdict = classify(response.status)
        if verdict == "ok":
            return IngestOutcome("ok", response.status)
        error = f"polar {response.status}: {response.text[:500]}"
        return IngestOutcome(verdict, response.status, error,
                             retry_after_seconds(response.headers.get("retry-after")),
                             _event_errors(response, len(events)) if verdict == "permanent"
                             else {})


def _event_errors(response: Answer, count: int) -> dict[int, str]:
    """Per-event validation errors (``loc: ["body", "events", i, ...]``) in a 4xx answer."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return {}
    found: dict[int, str] = {}
    for item in detail if isinstance(detail, list) else []:
        loc = item.get("loc") if isinstance(item, dict) else None
        if (isinstance(loc, list) and len(loc) >= 3 and loc[:2] == ["body", "events"]
                and isinstance(loc[2], int) and 0 <= loc[2] < count):
            where = ".".join(str(part) for part in loc[3:]) or "event"
            message = f"polar {response.status}: {where}: {item.get('msg', 'invalid')}"
            found[loc[2]] = (found[loc[2]] + "; " + message) if loc[2] in found else message
    return found


def polar_event(row: dict[str, Any]) -> dict[str, Any]:
    moment: datetime = row["occurred_at"] or row["created_at"]
    return {"name": row["event_name"], "external_customer_id": row["external_customer_id"],
            "metadata": row["metadata"] or {}, "external_id": row["id"],
            "timestamp": iso(moment)}
