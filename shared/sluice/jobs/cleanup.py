"""state-cleanup: delete expired platform_state rows, stale threshold-firing hash rows, old
operations history samples, abandoned feed caches (rss_builds expired a day ago) and
expired build leases, job_runs / admin_audit rows past their retention, the delivery
destination rows with no state worth keeping and no entry left (untouched for the delivery
retention), and the delivery rate rows whose next slot passed a day ago.

Deletes run in bounded batches, each its own short transaction, so a table with
millions of expired rows never holds one long lock. Rows not yet expired, and
hash rows under other prefixes, are never touched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sluice.core.crash import crash_point
from sluice.core.errors import PermanentStoreError
from sluice.core.times import iso_z
from sluice.jobs.registry import Deadline, JobContext, Result
from sluice.jobs.runs import Q as RUNS_Q
from sluice.store.db import Database, Query, load_queries
from sluice.store.history import RETENTION as HISTORY_RETENTION
from sluice.store.state import like_prefix

Q = load_queries("state")
HISTORY = load_queries("history")
DELIVERY = load_queries("delivery")
RATES = load_queries("ratelimit")

THRESHOLD_FIRING_PREFIX = "platform:ai-envelope-threshold-firings:"
THRESHOLD_FIRING_RETENTION_DAYS = 90
DEFAULT_BATCH_SIZE = 5_000
# A feed cache a scope reads is renewed every tick; one expired this long is abandoned.
# The day keeps a cache that expired while the ticks were paused renewable in place.
ABANDONED_BUILD_AFTER = timedelta(days=1)
# A rate row whose next slot is this far past spaces nothing: longer than any rate's interval.
IDLE_RATE_AFTER = timedelta(days=1)


BatchObserver = Callable[[int, float], None]  # (rows deleted, seconds the batch held its locks)


def delete_in_batches(db: Database, query: Query, params: dict[str, Any], *,
                      batch_size: int, deadline: Deadline, point: str,
                      observe: BatchObserver | None = None) -> int:
    """Repeat a ``LIMIT :limit`` delete until a batch comes back short or time runs out."""
    total = 0
    while not deadline.expired():
        started = time.perf_counter()
        with db.transaction() as tx:
            deleted = tx.execute(query, {**params, "limit": batch_size})
        total += deleted
        if observe is not None:
            observe(deleted, time.perf_counter() - started)
        crash_point(point)
        if deleted < batch_size:
            break
    return total


def cleanup_state(db: Database, *, now: datetime, deadline: Deadline,
                  batch_size: int = DEFAULT_BATCH_SIZE,
                  observe: BatchObserver | None = None,
                  runs_retention_days: int = 90, audit_retention_days: int = 400,
                  delivery_retention_days: int = 7) -> Result:
    """Each kind of row is cleaned on its own: one the store refuses to delete (a
    constraint, a trigger) fails its kind, named with the reason in ``errors``, and the
    other kinds are still cleaned. A store outage stops the run."""
    errors: list[str] = []

    def clean(kind: str, query: Query, params: dict[str, Any], *, point: str) -> int:
        try:
            return delete_in_batches(db, query, params, batch_size=batch_size,
                                     deadline=deadline, point=point, observe=observe)
        except PermanentStoreError as exc:
            errors.append(f"{kind}: {exc.code}: {exc.message[:300]}")
            return 0

    deleted = clean("state", Q.delete_expired_batch, {"now": now},
                    point="state-cleanup.after_state_batch")
    hash_deleted = clean("hash", Q.delete_stale_hash_batch,
                         {"pattern": like_prefix(THRESHOLD_FIRING_PREFIX),
                          "cutoff": now - timedelta(days=THRESHOLD_FIRING_RETENTION_DAYS)},
                         point="state-cleanup.after_hash_batch")
    samples_deleted = clean("history", HISTORY.prune_batch, {"cutoff": now - HISTORY_RETENTION},
                            point="state-cleanup.after_history_batch")
    builds_deleted = clean("builds", Q.delete_expired_builds_batch,
                           {"cutoff": now - ABANDONED_BUILD_AFTER},
                           point="state-cleanup.after_builds_batch")
    locks_deleted = clean("build-locks", Q.delete_expired_build_locks_batch, {"now": now},
                          point="state-cleanup.after_build_locks_batch")
    runs_deleted = clean("runs", RUNS_Q.delete_old_runs_batch,
                         {"cutoff": now - timedelta(days=runs_retention_days)},
                         point="state-cleanup.after_runs_batch")
    audit_deleted = clean("audit", RUNS_Q.delete_old_audit_batch,
                          {"cutoff": now - timedelta(days=audit_retention_days)},
                          point="state-cleanup.after_audit_batch")
    destinations_deleted = clean("delivery-destinations", DELIVERY.prune_destinations,
                                 {"now": now,
                                  "before": now - timedelta(days=delivery_retention_days)},
                                 point="state-cleanup.after_destinations_batch")
    rates_deleted = clean("delivery-rates", RATES.prune_rates,
                          {"before_us": int((now - IDLE_RATE_AFTER).timestamp() * 1_000_000)},
                          point="state-cleanup.after_rates_batch")
    return {"deleted": deleted, "deletedHashRecords": hash_deleted,
            "deletedSamples": samples_deleted,
            "deletedFeedCaches": builds_deleted, "deletedBuildLocks": locks_deleted,
            "deletedJobRuns": runs_deleted, "deletedAuditRecords": audit_deleted,
            "deletedDestinations": destinations_deleted, "deletedRateLimits": rates_deleted,
            "failed": len(errors), "errors": errors,
            "processedAt": iso_z(now)}


def run_state_cleanup(ctx: JobContext) -> Result:
    total = 0

    def progress(deleted: int, seconds: float) -> None:
        nonlocal total
        total += deleted
        ctx.progress(f"state-cleanup: {total} rows deleted")

    settings = ctx.services.settings
    return cleanup_state(ctx.services.db, now=ctx.started_at, deadline=ctx.deadline,
                         observe=progress,
                         runs_retention_days=settings.job_runs_retention_days,
                         audit_retention_days=settings.audit_retention_days,
                         delivery_retention_days=settings.delivery_retention_days)
