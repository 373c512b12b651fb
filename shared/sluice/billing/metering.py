"""metering-flush: drain ``ai_usage_metering_outbox`` to Polar's event ingestion API.

One Polar request in flight at a time, and each claimed row is marked ``processed``
or ``failed`` before the next is claimed (in the same transaction as that claim: one
commit a request), so a crash re-delivers at most the rows in flight. The outbox id is
the event's ``external_id``, which Polar deduplicates on: a re-delivered row is harmless.
A run keeps claiming until the outbox is empty or its deadline passes.

Attempts: only a send Polar judged counts against a row. The attempt is counted at
the claim (so a row whose send keeps killing the process, or whose outcome is never
recorded, still reaches ``MAX_METERING_ATTEMPTS``), then settled by the answer:

- counts: a 4xx refusing the event (uses up every attempt at once), and a 5xx or a
  timeout after the request was sent, when a later request of the same run succeeds
  (a run that ends on such answers gives their attempts back: a lone row meeting an
  outage run after run would otherwise use up its attempts one run at a time);
- given back: 429 / ``Retry-After`` (``rate_limited``), 401/403
  (``polar_unauthorized``), a connection that never reached Polar, and every request
  of a run of ``MAX_CONSECUTIVE_TRANSIENT`` transient answers in a row
  (``provider_unavailable``): the provider or Sluice's configuration was the problem;
- a store that fails between the send and the mark leaves the attempt counted (the
  outcome is unknown, as after a crash).
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from datetime import datetime
from typing import Any, Literal

from sluice.billing.polar import (
    IngestOutcome,
    PolarClient,
    polar_event,
)
from sluice.billing.usage import MAX_METERING_ATTEMPTS
from sluice.core.crash import crash_point
from sluice.egress import Egress
from sluice.jobs.registry import NO_FENCE, Deadline, Fence, FenceParams, JobContext, Result
from sluice.store.db import Database, Tx, load_queries

Q = load_queries("usage")

# Rows a run sends at most (a bound on one run, not a page: a run goes on to its deadline).
DEFAULT_FLUSH_LIMIT = 100_000
IN_FLIGHT_NOTE = "in flight: claimed by metering-flush, outcome unknown"
# Transient answers in a row after which the run stops, so an outage does not spend
# every row's attempts in one run.
MAX_CONSECUTIVE_TRANSIENT = 3
# How a failed row's attempt is settled: used up, kept (counted at the claim), given back.
Charge = Literal["exhaust", "count", "refund"]


class OutboxStore:
    """The outbox as the flush uses it: a claim and a settle are one statement each with
    the run's fence inside (``Fence.bind``). The settle of one request and the claim of
    the next share a transaction (``settle(..., then_claim=n)``; on Postgres, for one row
    sent and one to claim, a single statement), so a row costs one commit and one round
    trip. A fenced statement changes nothing without the lease; when a claim finds
    nothing, a separate check tells a lost lease from an empty outbox."""

    def __init__(self, db: Database, fence: Fence | None = None) -> None:
        self.db = db
        self.fence: Fence = fence or NO_FENCE

    def claim(self, limit: int, *, tried: Collection[str] = ()) -> list[dict[str, Any]]:
        """Claim up to ``limit`` eligible rows, oldest first, leaving out ``tried`` ids."""
        with self.db.transaction() as tx:
            rows = self._claim(tx, self.fence.bind(tx), limit, tried)
        return self._claimed(rows)

    def settle(self, processed: list[str], failed: dict[str, tuple[str, Charge]],
               now: datetime, *, refund: Collection[str] = (), then_claim: int = 0,
               tried: Collection[str] = ()) -> list[dict[str, Any]]:
        """Mark rows in one statement; ``failed`` maps id -> (error, charge); ``refund``
        gives back the attempt of rows settled earlier in the run. With ``then_claim``,
        the next rows are claimed (as ``claim``) in the same transaction, after the marks:
        one commit for both. Returns the rows claimed."""
        rows: dict[str, dict[str, str]] = {row_id: {"op": "refund"} for row_id in refund}
        rows.update((row_id, {"op": "failed", "error": error[:2000], "charge": charge})
                    for row_id, (error, charge) in failed.items())
        rows.update((row_id, {"op": "processed"}) for row_id in processed)
        if not rows:
            return self.claim(then_claim, tried=tried) if then_claim else []
        with self.db.transaction() as tx:
            fence = self.fence.bind(tx)
            one = len(processed) == 1 and len(rows) == 1  # the usual case, kept simple
            if one and then_claim == 1 and not tried and tx.dialect == "postgres":
                # Both in one statement on Postgres (no pipeline, no BEGIN and COMMIT).
                claimed = tx.fetchall(Q.mark_and_claim_one_outbox, {
                    **fence, "id": processed[0], "now": now,
                    "max_attempts": MAX_METERING_ATTEMPTS, "note": IN_FLIGHT_NOTE}, final=True)
            else:
                if one:
                    query, params = Q.mark_outbox_processed, {**fence, "id": processed[0],
                                                              "now": now}
                else:
                    query, params = Q.settle_outbox, {
                        **fence, "rows": tx.json(rows), "now": now,
                        "max_attempts": MAX_METERING_ATTEMPTS}
                if then_claim:
                    # No answer awaited: a claim in the same transaction that finds rows
                    # shows the lease was held for the marks too; one that finds none is
                    # checked.
                    tx.write(query, params)
                    claimed = self._claim(tx, fence, then_claim, tried)
                else:
                    settled = tx.fetchall(query, params, final=True)
        if then_claim:
            return self._claimed(claimed)
        if not settled:
            self._check_fence()
        return []

    def _claim(self, tx: Tx, fence: FenceParams, limit: int,
               tried: Collection[str]) -> list[dict[str, Any]]:
        params = {**fence, "max_attempts": MAX_METERING_ATTEMPTS, "note": IN_FLIGHT_NOTE}
        if limit == 1 and not tried and tx.dialect == "postgres":  # one plan, kept
            return tx.fetchall(Q.claim_one_outbox, params, final=True)
        return tx.fetchall(Q.claim_outbox, {**params, "limit": limit,
                                            "tried": tx.json(list(tried))}, final=True)

    def _claimed(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not rows:
            self._check_fence()
        rows.sort(key=lambda row: (row["created_at"], row["id"]))
        return rows

    def _check_fence(self) -> None:
        with self.db.transaction() as tx:
            self.fence.check(tx)

    def eligible_count(self, *, tried: Collection[str] = ()) -> int:
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.count_eligible_outbox, {"max_attempts": MAX_METERING_ATTEMPTS,
                                                        "tried": tx.json(list(tried))})
        return int(row["n"]) if row else 0


def flush(store: OutboxStore, polar: PolarClient, *, now: datetime, deadline: Deadline,
          limit: int = DEFAULT_FLUSH_LIMIT, events_per_request: int = 1) -> Result:
    processed = failed = 0
    reason: str | None = None
    streak: list[str] = []  # rows of the current run of transient answers in a row
    streak_requests = 0
    tried: set[str] = set()  # rows that failed in this run: they wait for the next one
    if limit > 0 and deadline.expired():
        reason = "deadline"
    rows = store.claim(min(events_per_request, limit)) if limit > 0 and not reason else []
    while rows:
        crash_point("metering.after_claim")
        done, errors, outcome = _send(polar, rows)
        crash_point("metering.after_send")
        tried.update(errors)
        refund: list[str] = []
        if outcome.verdict == "unauthorized":
            reason = "polar_unauthorized"
        elif outcome.verdict == "transient":
            if outcome.reached and not outcome.judged():  # 429 or Retry-After
                reason = "rate_limited"
            else:
                streak_requests += 1
                streak.extend(row_id for row_id, (_, charge) in errors.items()
                              if charge == "count")
                if streak_requests >= MAX_CONSECUTIVE_TRANSIENT:
                    reason = "provider_unavailable"
        else:
            streak, streak_requests = [], 0
        if reason == "provider_unavailable":
            # The run ends on an outage: none of its requests in a row was judged.
            refund = [row_id for row_id in streak if row_id not in errors]
            errors = {row_id: (error, "refund" if charge == "count" else charge)
                      for row_id, (error, charge) in errors.items()}
        processed += len(done)
        failed += len(errors)
        if reason is None and processed + failed < limit and deadline.expired():
            reason = "deadline"
        # The next request's rows are claimed with this one's marks, in one commit.
        more = min(events_per_request, limit - processed - failed) if reason is None else 0
        rows = store.settle(done, errors, now, refund=refund, then_claim=more, tried=tried)
        crash_point("metering.after_mark")
    if streak and reason != "provider_unavailable":
        # The run ended on transient answers that no success followed (the outbox ran out,
        # a 429, the deadline): nothing showed the rows rather than Polar at fault, so they
        # keep their attempts, as a longer run of such answers would have.
        store.settle([], {}, now, refund=streak)
    # Rows this run did not reach because it ended early (not those it sent and failed).
    skipped = min(store.eligible_count(tried=tried), limit - processed - failed) if reason else 0
    return {"processed": processed, "failed": failed, "skipped": skipped, "reason": reason}


def _send(polar: PolarClient, rows: list[dict[str, Any]]
          ) -> tuple[list[str], dict[str, tuple[str, Charge]], IngestOutcome]:
    """Send rows (one request, or more when Polar rejects single events); settle each."""
    failed: dict[str, tuple[str, Charge]] = {}
    pending = []
    for row in rows:
        unsendable = _unsendable(row)
        if unsendable:
            failed[row["id"]] = (unsendable, "exhaust")
        else:
            pending.append(row)
    if not pending:  # no request: the rows' verdicts are their own, not Polar's
        return [], failed, IngestOutcome("permanent", error="unsendable")
    while True:
        outcome = polar.ingest([polar_event(row) for row in pending])
        if outcome.verdict == "ok":
            return [row["id"] for row in pending], failed, outcome
        if outcome.verdict in ("transient", "unauthorized"):
            charge: Charge = "count" if outcome.judged() else "refund"
            for row in pending:
                failed[row["id"]] = (outcome.error or "transient", charge)
            return [], failed, outcome
        if not outcome.event_errors or len(outcome.event_errors) == len(pending):
            for i, row in enumerate(pending):
                failed[row["id"]] = (outcome.event_errors.get(i) or outcome.error
                                     or "rejected", "exhaust")
            return [], failed, outcome
        # Polar refused the request for some events only: those fail for good, and the
        # rest (not ingested, since the request was refused) go again at once.
        for i, error in outcome.event_errors.items():
            failed[pending[i]["id"]] = (error, "exhaust")
        pending = [row for i, row in enumerate(pending) if i not in outcome.event_errors]


def _unsendable(row: dict[str, Any]) -> str | None:
    """Why ``row`` can never become an event (a value JSON cannot carry, such as an
    infinite number in its metadata), or None. Such a row fails alone and for good instead
    of failing every request it is in."""
    try:
        json.dumps(polar_event(row), allow_nan=False)
    except Exception as exc:  # noqa: BLE001 - whatever one row's values raise is its verdict
        return f"unsendable: {type(exc).__name__}: {str(exc)[:200]}"
    return None


def run_metering_flush(ctx: JobContext) -> Result:
    settings = ctx.services.settings
    if not settings.polar_access_token:
        return {"processed": 0, "failed": 0, "skipped": 0, "reason": "polar_not_configured"}
    # each request ends by the run's deadline, and within 10 s whatever the deadline
    with Egress(timeout_s=10.0,
                deadline=time.monotonic() + ctx.deadline.remaining()) as client:
        polar = PolarClient(settings.polar_api_url, settings.polar_access_token, client=client)
        return flush(OutboxStore(ctx.services.db, ctx.fence), polar, now=ctx.started_at,
                     deadline=ctx.deadline, limit=DEFAULT_FLUSH_LIMIT,
                     events_per_request=settings.metering_events_per_request)
