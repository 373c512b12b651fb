"""``rss-refresh``, the ten-minute tick, in its fixed order:

1. with ``rssQueuePipeline`` on, publish one ``rss.ingest`` message (``sourceId:
   "all-sources"``, ``feedUrl: ""``); when the flag is off or the publish did not
   happen, refresh the global catalog inline (the admin ``POST`` rebuilds it even
   inside the rebuild throttle, still under the build lock; ``inlineRefreshed`` says
   whether a build was made); the admin ``POST``'s message says ``rebuild: true``, so
   its consumer rebuilds inside the throttle the same way;
2. tenant ingestion (not on the admin ``POST``): completed scopes, serially, forced,
   under ``SLUICE_TENANT_INGESTION_TIME_BUDGET_MS`` and the run's deadline, starting at
   the rotation offset so the tail of a long list is not starved; ``refreshed`` counts
   scopes rebuilt, ``shared``, ``throttled`` and ``locked`` the others. When the pipeline's
   message went out, the due builds are published instead (``sluice.rss.fanout``: one
   ``rss.ingest`` message per key) and only the scopes of keys that could not be
   published are built inline;
3. the alert sweep (``sluice.rss.sweep.ALERT_SWEEP_TARGET``, resolved before the builds so
   its new-stories listener hears them). Alerts for new stories found by the builds are
   evaluated inside the tick and counted in ``newStoryAlerts``. A deployment without the
   alerts pack sweeps nothing, and its result has no ``alertSweep``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from sluice.core.errors import SluiceError
from sluice.core.observe import logger
from sluice.jobs.registry import Deadline, JobContext, Result
from sluice.queues.handlers import PIPELINE_FLAG
from sluice.queues.publish import js_iso
from sluice.queues.runtime import publisher_of
from sluice.rss.catalog import REBUILD_FIELD, Catalog
from sluice.rss.fanout import due_builds, publish_builds, tick_report
from sluice.rss.store import RssStore
from sluice.rss.sweep import (
    ALERT_SWEEP_TARGET,
    Sweep,
    SweepResult,
    resolve_alert_sweep,
    sweep_unavailable,
)
from sluice.store.db import utcnow
from sluice.store.flags import FlagStore

if TYPE_CHECKING:
    from sluice.core.services import Services

ROTATION_WINDOW_MS = 10 * 60_000


class TenantIngestion(TypedDict):
    tenantScopes: int
    refreshed: int  # scopes whose build this tick made
    shared: int  # scopes served by a build made earlier in the tick or just now elsewhere
    throttled: int  # scopes refreshed less than the minimum interval ago
    locked: int  # scopes whose build another instance held past the wait
    failed: int
    skippedTimeBudget: int
    elapsedMs: int


EMPTY_INGESTION: TenantIngestion = {
    "tenantScopes": 0, "refreshed": 0, "shared": 0, "throttled": 0, "locked": 0, "failed": 0,
    "skippedTimeBudget": 0, "elapsedMs": 0}
# A refresh's outcome -> the count it belongs to ("fresh": a recent stored build, reused).
_COUNTED = {"built": "refreshed", "shared": "shared", "fresh": "shared",
            "throttled": "throttled", "locked": "locked"}


def rotation_offset(started_at_ms: int, count: int) -> int:
    """Where this tick starts in the scope list: moves by one every ten minutes."""
    return (started_at_ms // ROTATION_WINDOW_MS) % count if count else 0


def ingest_tenant_scopes(list_scopes: Callable[[], list[str]], refresh: Callable[[str], Any],
                         *, started_at_ms: int, budget: Deadline,
                         monotonic: Callable[[], float] = time.monotonic,
                         progress: Callable[[str], None] = lambda message: None,
                         ) -> TenantIngestion:
    """Refresh every listed scope in turn until ``budget`` runs out; one failing scope (a
    store outage during its refresh too) is counted and logged, and the rest go on. Scopes
    not reached are counted, not retried."""
    started = monotonic()
    try:
        scope_ids = list_scopes()
    except SluiceError as exc:
        logger.error(f"[rss-refresh] listing tenant scopes failed; ingesting none: {exc}")
        scope_ids = []
    count = len(scope_ids)
    offset = rotation_offset(started_at_ms, count)
    order = scope_ids[offset:] + scope_ids[:offset]
    result: TenantIngestion = {**EMPTY_INGESTION, "tenantScopes": count}
    for index, scope_id in enumerate(order):
        if budget.expired():
            result["skippedTimeBudget"] = count - index
            break
        progress(f"tenant ingestion {index + 1}/{count}: {scope_id}")
        try:
            outcome = getattr(refresh(scope_id), "outcome", "built")
        except Exception as exc:  # noqa: BLE001 - one tenant's failure never stops the others
            # a store outage in its refresh included: that scope's failure (it costs no
            # attempt: a source whose fetch was not recorded is simply fetched again)
            result["failed"] += 1
            logger.error(f"[rss-refresh] tenant ingestion failed for {scope_id}: {exc}")
            continue
        key = _COUNTED.get(outcome, "refreshed")
        result[key] += 1  # type: ignore[literal-required]
    result["elapsedMs"] = int((monotonic() - started) * 1000)
    return result


def _publish(services: Services, *, rebuild: bool) -> bool:
    """True when the ``rss.ingest`` message went out (or ran in process). ``rebuild`` (the
    admin ``POST``) asks the consumer for the inline path's rebuild inside the throttle."""
    fields: dict[str, Any] = {"sourceId": "all-sources", "feedUrl": ""}
    if rebuild:
        fields[REBUILD_FIELD] = True
    try:
        published = publisher_of(services).publish("rss.ingest", fields)
    except Exception as exc:  # noqa: BLE001 - SQS or signing trouble: refresh inline instead
        services.reporter.error("rss-refresh.publish", exc)
        return False
    return published.dispatched


def _fan_out(services: Services, started_at: datetime,
             budget: Deadline) -> tuple[dict[str, Any], list[str]]:
    """Publish the due builds; the tick's fan-out figures (with what the consumers did so
    far: everything, in process) and the scopes left to build inline."""
    settings = services.settings
    due = due_builds(RssStore(services.db), services.db, now=utcnow(),
                     min_interval=timedelta(seconds=settings.rss_scope_min_interval_s))
    counts, left = publish_builds(
        services, due, offset=rotation_offset(int(started_at.timestamp() * 1000), len(due)),
        budget=budget, now=utcnow())
    done = tick_report(services.db, counts["tickId"]) or {}
    return {**done, **counts}, left


def refresh_tick(services: Services, *, tenant_ingestion: bool, deadline: Deadline,
                 started_at: datetime, catalog: Catalog | None = None, manual: bool = False,
                 monotonic: Callable[[], float] = time.monotonic,
                 progress: Callable[[str], None] = lambda message: None) -> Result:
    try:
        run_alert_sweep: Sweep | None = resolve_alert_sweep()
    except (ImportError, AttributeError) as exc:  # a deploy without the sweep: say so, go on
        services.reporter.error("rss-refresh.alert-sweep", exc, target=ALERT_SWEEP_TARGET)
        run_alert_sweep = sweep_unavailable
    owned = catalog is None
    # sockets wait in real time: the builds' deadline is on the real monotonic clock
    catalog = catalog or Catalog.open(services, stop_at=time.monotonic() + deadline.remaining())
    catalog.announce_now = True  # new-story alerts run inside the tick, so its answer counts them
    try:
        failed = 0
        pipeline = FlagStore(services.state).enabled(PIPELINE_FLAG)
        published = _publish(services, rebuild=manual) if pipeline else False
        inline = False
        if not published:
            progress("refreshing the global catalog")
            try:
                # The manual POST rebuilds even inside the throttle; true only when built.
                refreshed = catalog.refresh_global(force=True, rebuild=manual)
                inline = refreshed.outcome == "built"
            except SluiceError as exc:
                failed += 1
                services.reporter.error("rss-refresh.global", exc)
        fan_out: dict[str, Any] | None = None
        if tenant_ingestion:
            store = RssStore(services.db)
            budget_s = min(services.settings.tenant_ingestion_budget_ms / 1000,
                           deadline.remaining())
            budget = Deadline(budget_s, clock=monotonic)
            list_scopes = store.completed_scope_ids
            if published:  # the queue works: the consumers build, in parallel
                progress("publishing the due builds")
                fan_out, left = _fan_out(services, started_at, budget)
                list_scopes = left.copy  # the scopes of keys that could not be published
            tenants = ingest_tenant_scopes(
                list_scopes, lambda scope: catalog.refresh_scope(scope, force=True),
                started_at_ms=int(started_at.timestamp() * 1000),
                budget=budget, monotonic=monotonic, progress=progress)
        else:
            tenants = dict(EMPTY_INGESTION)  # type: ignore[assignment]
        sweep: SweepResult | None = None
        if run_alert_sweep is not None:  # None: the alerts pack is off, nothing to sweep
            progress("alert sweep")
            try:
                sweep = run_alert_sweep(services, deadline, builds=catalog.current_builds())
            except SluiceError as exc:  # the store failed under the sweep's listing
                services.reporter.error("rss-refresh.alert-sweep", exc)
                sweep = sweep_unavailable(services, deadline)
        counters = catalog.counters
        failed += tenants["failed"] + (sweep["failed"] if sweep else 0) \
            + counters.new_story_failures
        result: Result = {
            "published": published, "pipelineEnabled": pipeline, "inlineRefreshed": inline,
            "tenantIngestion": dict(tenants),
            **({} if sweep is None else {"alertSweep": dict(sweep)}),
            "newStoryAlerts": {"enqueued": counters.new_story_alerts,
                               "failed": counters.new_story_failures},
            "refreshedAt": js_iso(utcnow()), "failed": failed,
            "catalog": catalog.counters.to_json()}
        if fan_out is not None:
            result["fanOut"] = fan_out
        return result
    finally:
        if owned:
            catalog.close()


def run_rss_refresh(ctx: JobContext) -> Result:
    """The job: ``GET``, the schedule and the command line run everything; the admin
    ``POST`` refreshes the global catalog and sweeps, without tenant ingestion."""
    manual = ctx.trigger == "admin"
    return refresh_tick(ctx.services, tenant_ingestion=not manual, manual=manual,
                        deadline=ctx.deadline, started_at=ctx.started_at,
                        progress=ctx.progress)
