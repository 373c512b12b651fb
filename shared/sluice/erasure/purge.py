"""erasure-purge: purge the subjects of due erasure requests, one after another, and prove it.

Each purge is one transaction: lock the request row, re-check it is still
active (if not, skip it: an operator cancelled or confirmed it meanwhile, which
is not a failure), delete or pseudonymise the subject in every registry target,
leave a tombstone for the subject (``erasure_tombstones``: every producer of ledger
rows drops entries of a tombstoned user, so nothing erased comes back), and mark the
request ``purged`` with per-table counts. After the commit, the external stores
(Redis lists) are swept idempotently, and a verification counts what is left of the
subject everywhere; anything above zero marks the request ``failed`` and is reported
as a drain failure, so it pages.

Requests run serially, never in parallel: each purge is one transaction that locks
rows in every table holding the subject, so running them side by side would hold
several such transactions on the pool at once, stall the app's own queries behind them
and risk deadlocks between purges touching the same rows. The tombstone stays ``sweep_pending`` until the sweep
succeeds: a crash after the commit, or Redis down during the sweep, is swept again by
every following run, first thing, without an operator.

A purge that raised (and rolled back: nothing was purged) is that request's failure, never
the run's: the others go on. The run counts it in ``failed``, so the run it fails in pages,
and records one attempt on the request (``purge_attempts``, ``last_error``); the request
stays due, so every later run tries it again (after the requests never tried) until it
succeeds, paging each run it fails again: personal data still present is never left to a
bound running out. A store outage is no request's fault and costs no attempt: the rest of
the due list waits for the next run.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sluice.core.crash import crash_point
from sluice.core.errors import (
    Conflict,
    LeaseLost,
    NotFound,
    SluiceError,
    TransientStoreError,
)
from sluice.core.observe import logger
from sluice.erasure.registry import EXTERNAL_STORES, present_targets, subject_params
from sluice.erasure.requests import ErasureRequest, ErasureStatus, ErasureStore, iso
from sluice.jobs.registry import Deadline, Fence, JobContext, Result
from sluice.store.db import load_queries, utcnow

if TYPE_CHECKING:
    from sluice.core.services import Services

Q = load_queries("erasure")

SYSTEM_ACTOR = "system:erasure-purge"
JOB_NAME = "erasure-purge"
BATCH = 100
TRUE = frozenset({"1", "true", "yes"})


def pseudonym(request_id: str) -> str:
    """What a pseudonymised actor column becomes: resolvable only through the request row."""
    return f"erased:{request_id}"


class PurgeOutcome:
    __slots__ = ("attempts", "error", "id", "remaining", "status", "tables")

    def __init__(self, id: str, status: str, tables: dict[str, int] | None = None,
                 remaining: dict[str, int] | None = None, error: str | None = None,
                 attempts: int | None = None) -> None:
        self.attempts = attempts
        self.id = id
        self.status = status  # purged | failed | skipped | would_purge
        self.tables: dict[str, int] = tables if tables is not None else {}
        self.remaining: dict[str, int] = remaining if remaining is not None else {}
        self.error = error

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "status": self.status, "tables": self.tables}
        if self.remaining:
            body["remaining"] = self.remaining
        if self.error:
            body["error"] = self.error
        if self.attempts is not None:
            body["attempts"] = self.attempts
        return body


def count_subject(services: Services, subject: str) -> dict[str, int]:
    """How many rows / entries of ``subject`` every registered store still holds."""
    params = subject_params(subject, pseudonym="")
    counts: dict[str, int] = {}
    with services.db.transaction() as tx:
        for target in present_targets(tx):
            row = tx.fetchone(target.count, params)
            counts[target.name] = int(row["n"]) if row else 0
    for store in EXTERNAL_STORES:
        counts.update(store.count(services.redis, subject))
    return counts


def purge_request(services: Services, request_id: str, *, confirmed_by: str,
                  now: datetime | None = None,
                  allowed: tuple[ErasureStatus, ...] = (ErasureStatus.REQUESTED,),
                  fence: Fence | None = None) -> PurgeOutcome | None:
    """Purge one request's subject; ``None`` when the request is no longer in ``allowed``."""
    now = now or utcnow()
    with services.db.transaction() as tx:
        if fence is not None:
            fence.check(tx)
        row = tx.fetchone(Q.lock_request, {"id": request_id})
        if row is None:
            raise NotFound(f"no erasure request {request_id!r}", id=request_id)
        request = ErasureRequest.from_row(row)
        if request.status not in allowed:
            return None
        alias = pseudonym(request_id)
        params = subject_params(request.subject_user_id, alias)
        tables = {target.name: tx.execute(target.purge, params)
                  for target in present_targets(tx)}
        crash_point("erasure.in_purge_tx")
        tx.execute(Q.put_tombstone, {"subject": request.subject_user_id, "id": request_id,
                                     "now": now})
        tx.execute(Q.mark_purged, {
            "id": request_id, "now": now,
            "confirmed_by": alias if confirmed_by == request.subject_user_id else confirmed_by,
            "result": tx.json({"tables": tables}),
        })
    crash_point("erasure.after_commit")
    return settle(services, request_id, request.subject_user_id, tables)


def settle(services: Services, request_id: str, subject: str, tables: dict[str, int],
           ) -> PurgeOutcome:
    """After the commit: sweep the external stores, verify, and mark verified or failed."""
    tables = dict(tables)
    error: str | None = None
    remaining: dict[str, int] = {}
    swept = False
    try:
        for store in EXTERNAL_STORES:
            tables.update(store.purge(services.redis, subject))
        swept = True
        remaining = {name: n for name, n in count_subject(services, subject).items() if n}
        if remaining:
            error = "personal data remained after the purge: " + ", ".join(
                f"{name}={n}" for name, n in sorted(remaining.items()))
    except SluiceError as exc:  # the purge has committed: a sweep that fails (Redis down)
        # settles the request as failed, which pages; it never leaves it looking done.
        error = f"sweep or verification failed after the purge: {exc.code}: {exc.message}"
    result: dict[str, Any] = {"tables": tables, "remaining": remaining}
    settled = utcnow()
    with services.db.transaction() as tx:
        if swept:
            tx.execute(Q.sweep_done, {"subject": subject, "id": request_id})
        if error is None:
            result["verifiedAt"] = iso(settled)
            tx.execute(Q.mark_verified, {"id": request_id, "now": settled,
                                         "result": tx.json(result)})
        else:
            tx.execute(Q.mark_failed, {"id": request_id, "now": settled,
                                       "result": tx.json(result), "last_error": error})
    return PurgeOutcome(request_id, "failed" if error else "purged", tables, remaining, error)


def preview(services: Services, request: ErasureRequest) -> PurgeOutcome:
    """The dry run: what a purge of ``request`` would delete or pseudonymise, per table."""
    return PurgeOutcome(request.id, "would_purge",
                        count_subject(services, request.subject_user_id))


def confirm(services: Services, request_id: str, *, confirmed_by: str, dry_run: bool = False,
            now: datetime | None = None) -> tuple[ErasureRequest, PurgeOutcome]:
    """An operator purges one request now, skipping what is left of its grace window.

    ``requested`` and ``failed`` requests may be confirmed (a failed one is purged
    again, which is how an operator retries after fixing the cause).
    """
    store = ErasureStore(services.db)
    request = store.get(request_id)
    if request.status in (ErasureStatus.CANCELLED, ErasureStatus.PURGED):
        raise Conflict(f"erasure request {request_id} is {request.status.value} and cannot be "
                       "confirmed" + ("; create a new request" if request.status
                                      is ErasureStatus.CANCELLED else ""),
                       id=request_id, status=request.status.value)
    if dry_run:
        return request, preview(services, request)
    outcome = purge_request(services, request_id, confirmed_by=confirmed_by, now=now,
                            allowed=(ErasureStatus.REQUESTED, ErasureStatus.FAILED))
    current = store.get(request_id)
    if outcome is None:
        raise Conflict(f"erasure request {request_id} became {current.status.value} meanwhile",
                       id=request_id, status=current.status.value)
    if outcome.status == "failed":
        services.reporter.drain_failures("erasure-confirm", 1, outcome.to_json())
    return current, outcome


def purge_due(services: Services, *, now: datetime, dry_run: bool = False,
              deadline: Deadline | None = None,
              progress: Callable[[str], None] | None = None,
              fence: Fence | None = None) -> Result:
    store = ErasureStore(services.db)
    due = store.due(now, limit=BATCH)
    results: list[PurgeOutcome] = []
    if dry_run:
        results = [preview(services, request) for request in due]
        return {"dryRun": True, "due": len(due), "purged": 0, "failed": 0, "skipped": 0,
                "results": [r.to_json() for r in results], "processedAt": iso(now)}
    # First sweep again what a crash or an unreachable Redis left unswept.
    resumed = 0
    for request in store.sweep_pending():
        tables = (request.result or {}).get("tables", {})
        results.append(settle(services, request.id, request.subject_user_id, tables))
        resumed += 1
    skipped = deferred = 0
    reason: str | None = None
    for index, request in enumerate(due):
        if deadline is not None and deadline.expired():
            deferred = len(due) - index  # left `requested`: the next run takes them
            break
        if progress:
            progress(f"purging request {index + 1}/{len(due)}")
        try:
            outcome = purge_request(services, request.id, confirmed_by=SYSTEM_ACTOR, now=now,
                                    fence=fence)
        except LeaseLost:
            raise
        except TransientStoreError:  # an outage is no request's fault: the rest wait
            deferred, reason = len(due) - index, "store_unavailable"
            break
        except SluiceError as exc:  # rolled back: failed in this run, tried again next run
            outcome = _raised(services, request.id, f"{exc.code}: {exc.message}", now)
        except Exception as exc:  # noqa: BLE001 - whatever one request raises is its failure
            outcome = _raised(services, request.id,
                              f"{type(exc).__name__}: {str(exc)[:300]}", now)
        if outcome is None:
            skipped += 1
            outcome = PurgeOutcome(request.id, "skipped")
        results.append(outcome)
    return {
        "due": len(due),
        "purged": sum(r.status == "purged" for r in results),
        "failed": sum(r.status == "failed" for r in results),
        "skipped": skipped, "deferred": deferred, "resumed": resumed, "reason": reason,
        "results": [r.to_json() for r in results],
        "processedAt": iso(now),
    }


def _raised(services: Services, request_id: str, error: str, now: datetime,
           ) -> PurgeOutcome | None:
    """Count a purge that raised (and rolled back) on its request: ``failed`` in this run
    (paged with the run), the request left due for the next; ``None`` when the request
    stopped being ``requested`` meanwhile."""
    with services.db.transaction() as tx:
        row = tx.fetchone(Q.record_purge_error, {
            "id": request_id, "now": now, "last_error": error,
            "result": tx.json({"tables": {}, "error": error})})
    if row is None:
        return None
    attempts = int(row["purge_attempts"])
    logger.warning(f"[{JOB_NAME}] purge of {request_id} raised (attempt {attempts}); "
                   "the next run tries it again",
                   extra={"requestId": request_id, "error": error, "attempts": attempts})
    return PurgeOutcome(request_id, "failed", error=error, attempts=attempts)


def run_erasure_purge(ctx: JobContext) -> Result:
    dry_run = ctx.params.get("dryRun", "").lower() in TRUE
    return purge_due(ctx.services, now=ctx.started_at, dry_run=dry_run, deadline=ctx.deadline,
                     progress=ctx.progress, fence=ctx.fence)
