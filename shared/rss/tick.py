"""``rss-refresh``, the ten-minute tick, in its fixed order:

1. with ``rssQueuePipeline`` on, publish one ``rss.ingest`` message (``sourceId:
   "all-sources"``, ``feedUrl: ""``); when the flag is off or the publish did not
   happen, refresh the global catalog inline;
2. tenant ingestion (not on the admin ``POST``): completed scopes, serially, forced,
   under ``SLUICE_TENANT_INGESTION_TIME_BUDGET_MS`` and the run's deadline, starting at
   the rotation offset so the tail of a long list is not starved. When the pipeline's
   message went out, the due builds are published instead (``shared.rss.fanout``: one
   ``rss.ingest`` message per key) and only the scopes of keys that could not be
   published are built inline;
3. the alert sweep (``shared.rss.sweep.ALERT_SWEEP_TARGET``, resolved before the builds so
   its new-stories listener hears them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from shared.core.errors import SluiceError
from shared.core.observe import logger
from shared.jobs.registry import Deadline, JobContext, Result
from shared.queues.handlers import PIPELINE_FLAG
from shared.queues.publish import js_iso
from shared.queues.runtime import publisher_of
from shared.rss.catalog import Catalog
from shared.rss.fanout import due_builds, publish_builds, tick_report
from shared.rss.store import RssStore
from shared.rss.sweep import (
    ALERT_SWEEP_TARGET,
    Sweep,
    resolve_alert_sweep,
    sweep_unavailable,
)
from shared.store.db import utcnow
from shared.store.flags import FlagStore

if TYPE_CHECKING:
    from shared.core.services import Services

ROTATION_WINDOW_MS = 10 * 60_000


class TenantIngestion(TypedDict):
    tenantScopes: int
    refreshed: int
    failed: int
    skippedTimeBudget: int
    elapsedMs: int


def rotation_offset(started_at_ms: int, count: int) -> int:
    """Where this tick starts in the scope list: moves by one every ten minutes."""
    return (started_at_ms // ROTATION_WINDOW_MS) % count if count else 0


def ingest_tenant_scopes(list_scopes: Callable[[], list[str]], refresh: Callable[[str], Any],
                         *, started_at_ms: int, budget: Deadline,
                         monotonic: Callable[[], float] = time.monotonic,
                         progress: Callable[[str], None] = lambda message: None,
                         ) -> TenantIngestion:
    """Refresh every listed scope in turn until ``budget`` runs out; one failing scope is
    counted and logged, and the rest go on. Scopes not reached are counted, not retried."""
    started = monotonic()
    try:
        scope_ids = list_scopes()
    except SluiceError as exc:
        logger.error(f"[rss-refresh] listing tenant scopes failed; ingesting none: {exc}")
        scope_ids = []
    count = len(scope_ids)
    offset = rotation_offset(started_at_ms, count)
    order = scope_ids[offset:] + scope_ids[:offset]
    refreshed = failed = skipped = 0
    for index, scope_id in enumerate(order):
        if budget.expired():
            skipped = count - index
            break
        progress(f"tenant ingestion {index + 1}/{count}: {scope_id}")
        try:
            refresh(scope_id)
            refreshed += 1
        except Exception as exc:  # noqa: BLE001 - one tenant's failure never stops the others
            failed += 1
            logger.error(f"[rss-refresh] tenant ingestion failed for {scope_id}: {exc}")
    return {"tenantScopes": count, "refreshed": refreshed, "failed": failed,
            "skippedTimeBudget": skipped, "elapsedMs": int((monotonic() - started) * 1000)}


def _publish(services: Services) -> bool:
    """True when the ``rss.ingest`` message went out (or ran in process)."""
    try:
        published = publisher_of(services).publish(
            "rss.ingest", {"sourceId": "all-sources", "feedUrl": ""})
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
                 started_at: datetime, catalog: Catalog | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 progress: Callable[[str], None] = lambda message: None) -> Result:
    try:
        run_alert_sweep: Sweep = resolve_alert_sweep()
    except (ImportError, AttributeError) as exc:  # a deploy without the sweep: say so, go on
        services.reporter.error("rss-refresh.alert-sweep", exc, target=ALERT_SWEEP_TARGET)
        run_alert_sweep = sweep_unavailable
    owned = catalog is None
    catalog = catalog or Catalog.open(services)
    try:
        failed = 0
        pipeline = FlagStore(services.state).enabled(PIPELINE_FLAG)
        published = _publish(services) if pipeline else False
        inline = False
        if not published:
            progress("refreshing the global catalog")
            try:
                catalog.refresh_global(force=True)
                inline = True
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
            tenants = {"tenantScopes": 0, "refreshed": 0, "failed": 0, "skippedTimeBudget": 0,
                       "elapsedMs": 0}
        progress("alert sweep")
        sweep = run_alert_sweep(services, deadline)
        failed += tenants["failed"] + sweep["failed"]
        result: Result = {
            "published": published, "pipelineEnabled": pipeline, "inlineRefreshed": inline,
            "tenantIngestion": dict(tenants), "alertSweep": dict(sweep),
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
    return refresh_tick(ctx.services, tenant_ingestion=ctx.trigger != "admin",
                        deadline=ctx.deadline, started_at=ctx.started_at,
                        progress=ctx.progress)
