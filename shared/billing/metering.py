"""metering-flush: drain ``ai_usage_metering_outbox`` to Polar's event ingestion API.

One Polar request in flight at a time, and each claimed row is marked ``processed``
or ``failed`` before the next is claimed, so a crash re-delivers at most the rows in
flight. The outbox id is the event's ``external_id``, which Polar deduplicates on: a
re-delivered row is harmless. The attempt is counted at the claim, so a row that
keeps killing the process still reaches ``MAX_METERING_ATTEMPTS``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import httpx

from shared.billing.usage import MAX_METERING_ATTEMPTS, iso
from shared.core.crash import crash_point
from shared.jobs.registry import Deadline, JobContext, Result
from shared.store.db import Database, load_queries

Q = load_queries("usage")

DEFAULT_FLUSH_LIMIT = 100
INGEST_PATH = "/v1/events/ingest"
IN_FLIGHT_NOTE = "in flight: claimed by metering-flush, outcome unknown"
# Transient answers in a row after which the run stops, so an outage does not spend
# every row's attempts in one run.
MAX_CONSECUTIVE_TRANSIENT = 3
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


class PolarClient:
    """``POST {api_url}/v1/events/ingest`` with a bearer token, over a given httpx client."""

    def __init__(self, api_url: str, token: str, *, client: httpx.Client) -> None:
        self.url = api_url.rstrip("/") + INGEST_PATH
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.client = client

    def ingest(self, events: list[dict[str, Any]]) -> IngestOutcome:
        try:
            response = self.client.post(self.url, json={"events": events}, headers=self.headers)
        except httpx.HTTPError as exc:
            return IngestOutcome("transient", error=f"network: {type(exc).__name__}: {exc}")
        verdict = classify(response.status_code)
        if verdict == "ok":
            return IngestOutcome("ok", response.status_code)
        error = f"polar {response.status_code}: {response.text[:500]}"
        return IngestOutcome(verdict, response.status_code, error,
                             retry_after_seconds(response.headers.get("retry-after")),
                             _event_errors(response, len(events)) if verdict == "permanent"
                             else {})


def _event_errors(response: httpx.Response, count: int) -> dict[int, str]:
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
            message = f"polar {response.status_code}: {where}: {item.get('msg', 'invalid')}"
            found[loc[2]] = (found[loc[2]] + "; " + message) if loc[2] in found else message
    return found


def polar_event(row: dict[str, Any]) -> dict[str, Any]:
    moment: datetime = row["occurred_at"] or row["created_at"]
    return {"name": row["event_name"], "external_customer_id": row["external_customer_id"],
            "metadata": row["metadata"] or {}, "external_id": row["id"],
            "timestamp": iso(moment)}


class OutboxStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def claim(self, limit: int, *, tried: Collection[str] = ()) -> list[dict[str, Any]]:
        """Claim up to ``limit`` eligible rows, oldest first, leaving out ``tried`` ids."""
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.eligible_outbox,
                               {"limit": limit, "max_attempts": MAX_METERING_ATTEMPTS,
                                "tried": tx.json(list(tried))})
            if rows:
                tx.executemany(Q.claim_outbox_row,
                               [{"id": row["id"], "note": IN_FLIGHT_NOTE} for row in rows])
        return rows

    def settle(self, processed: list[str], failed: dict[str, tuple[str, bool]],
               now: datetime) -> None:
        """Mark rows in one transaction; ``failed`` maps id -> (error, permanent)."""
        with self.db.transaction() as tx:
            if processed:
                tx.executemany(Q.mark_outbox_processed,
                               [{"id": row_id, "now": now} for row_id in processed])
            if failed:
                tx.executemany(Q.mark_outbox_failed, [
                    {"id": row_id, "error": error[:2000], "exhaust": permanent,
                     "max_attempts": MAX_METERING_ATTEMPTS}
                    for row_id, (error, permanent) in failed.items()])

    def eligible_count(self, *, tried: Collection[str] = ()) -> int:
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.count_eligible_outbox, {"max_attempts": MAX_METERING_ATTEMPTS,
                                                        "tried": tx.json(list(tried))})
        return int(row["n"]) if row else 0


def flush(store: OutboxStore, polar: PolarClient, *, now: datetime, deadline: Deadline,
          limit: int = DEFAULT_FLUSH_LIMIT, events_per_request: int = 1) -> Result:
    processed = failed = 0
    reason: str | None = None
    transient_in_a_row = 0
    tried: set[str] = set()
    while processed + failed < limit:
        if deadline.expired():
            reason = "deadline"
            break
        rows = store.claim(min(events_per_request, limit - processed - failed), tried=tried)
        if not rows:
            break
        tried.update(row["id"] for row in rows)
        crash_point("metering.after_claim")
        done, errors, outcome = _send(polar, rows)
        crash_point("metering.after_send")
        store.settle(done, errors, now)
        crash_point("metering.after_mark")
        processed += len(done)
        failed += len(errors)
        if outcome.verdict == "unauthorized":
            reason = "polar_unauthorized"
            break
        if outcome.verdict == "transient":
            transient_in_a_row += 1
            if outcome.retry_after is not None or outcome.status == 429:
                reason = "rate_limited"
                break
            if transient_in_a_row >= MAX_CONSECUTIVE_TRANSIENT:
                reason = "provider_unavailable"
                break
        else:
            transient_in_a_row = 0
    # Rows this run did not reach because it ended early (not those it sent and failed).
    skipped = min(store.eligible_count(tried=tried), limit - processed - failed) if reason else 0
    return {"processed": processed, "failed": failed, "skipped": skipped, "reason": reason}


def _send(polar: PolarClient, rows: list[dict[str, Any]]
          ) -> tuple[list[str], dict[str, tuple[str, bool]], IngestOutcome]:
    """Send rows (one request, or more when Polar rejects single events); settle each."""
    failed: dict[str, tuple[str, bool]] = {}
    pending = rows
    while True:
        outcome = polar.ingest([polar_event(row) for row in pending])
        if outcome.verdict == "ok":
            return [row["id"] for row in pending], failed, outcome
        if outcome.verdict in ("transient", "unauthorized"):
            for row in pending:
                failed[row["id"]] = (outcome.error or "transient", False)
            return [], failed, outcome
        if not outcome.event_errors or len(outcome.event_errors) == len(pending):
            for i, row in enumerate(pending):
                failed[row["id"]] = (outcome.event_errors.get(i) or outcome.error
                                     or "rejected", True)
            return [], failed, outcome
        # Polar refused the request for some events only: those fail for good, and the
        # rest (not ingested, since the request was refused) go again at once.
        for i, error in outcome.event_errors.items():
            failed[pending[i]["id"]] = (error, True)
        pending = [row for i, row in enumerate(pending) if i not in outcome.event_errors]


def run_metering_flush(ctx: JobContext) -> Result:
    settings = ctx.services.settings
    if not settings.polar_access_token:
        return {"processed": 0, "failed": 0, "skipped": 0, "reason": "polar_not_configured"}
    timeout = httpx.Timeout(min(10.0, max(1.0, ctx.deadline.remaining())))
    with httpx.Client(timeout=timeout) as client:
        polar = PolarClient(settings.polar_api_url, settings.polar_access_token, client=client)
        return flush(OutboxStore(ctx.services.db), polar, now=ctx.started_at,
                     deadline=ctx.deadline, limit=DEFAULT_FLUSH_LIMIT,
                     events_per_request=settings.metering_events_per_request)
