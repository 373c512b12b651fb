"""The alert sweep, run by the rss tick after tenant ingestion.

Tenants are the scopes with a ``platform:alerts-rules:`` row (one that never wrote a
rules row is invisible here). They are evaluated in batches of ``SWEEP_CONCURRENCY``
threads; each reads its candidate stories through ``peek_scope`` (stored builds only,
never a fetch or a build), shared by every scope on the same build within one sweep
(the tick hands over the builds it made or found fresh, which are not read again),
and each build's stories are normalised once. A scope without a stored build counts in
``skippedNoFeedCache``; a failing scope is logged and counted in ``failed`` and the
others go on; scopes not reached before the deadline count in ``skippedDeadline``.
Then the effect records whose story is gone are pruned (``sluice.alerts.effects``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from sluice.alerts.effects import prune_effects
from sluice.alerts.evaluate import Prepared, evaluate, prepare
from sluice.alerts.rules import RulesStore
from sluice.core import trace
from sluice.core.observe import logger
from sluice.delivery.store import DeliveryStore
from sluice.rss.catalog import peek_scope
from sluice.rss.store import CatalogBuild
from sluice.rss.sweep import SweepResult

if TYPE_CHECKING:
    from sluice.core.services import Services
    from sluice.jobs.registry import Deadline

SWEEP_CONCURRENCY = 5


class _Shared:
    """What the scopes of one sweep share: builds by key, and their prepared stories."""

    def __init__(self, builds: Mapping[str, CatalogBuild] | None = None) -> None:
        self.builds: dict[str, CatalogBuild | None] = dict(builds or {})
        self.prepared: dict[str, list[Prepared]] = {}
        self.lock = threading.Lock()

    def stories(self, build: CatalogBuild) -> list[Prepared]:
        with self.lock:
            found = self.prepared.get(build.key)
            if found is None:
                found = self.prepared[build.key] = prepare(build.stories)
        return found


def run_alert_sweep(services: Services, deadline: Deadline, *,
                    builds: Mapping[str, CatalogBuild] | None = None) -> SweepResult:
    """``builds``: the tick's own builds by key (read from the store otherwise)."""
    store = RulesStore(services)
    deliveries = DeliveryStore(services.db)
    shared = _Shared(builds)
    result: SweepResult = {"tenantsWithRules": 0, "evaluated": 0, "skippedNoFeedCache": 0,
                           "failed": 0, "skippedDeadline": 0, "evaluations": 0,
                           "enqueued": 0}
    counts_lock = threading.Lock()
    sweeping = trace.carrier() or None  # the workers' spans join the tick's trace

    def one(scope_id: str) -> None:
        try:
            rules = [rule for rule in store.get(scope_id) if rule.enabled]
            if not rules:
                return
            with counts_lock:
                result["tenantsWithRules"] += 1
            build = peek_scope(services, scope_id, builds=shared.builds, lock=shared.lock)
            if build is None:
                with counts_lock:
                    result["skippedNoFeedCache"] += 1
                return
            outcome = evaluate(services, scope_id, rules, shared.stories(build),
                               deliveries=deliveries, parent=sweeping)
            with counts_lock:
                result["evaluated"] += 1
                result["evaluations"] += outcome.evaluations
                result["enqueued"] += outcome.enqueued
        except Exception as exc:  # noqa: BLE001 - one tenant's failure never stops the others
            with counts_lock:
                result["failed"] += 1
            logger.error(f"[alerts] sweep evaluation failed for {scope_id}: {exc}")

    scope_ids = store.scope_ids()
    with ThreadPoolExecutor(max_workers=SWEEP_CONCURRENCY,
                            thread_name_prefix="alert-sweep") as pool:
        for start in range(0, len(scope_ids), SWEEP_CONCURRENCY):
            if deadline.expired():
                result["skippedDeadline"] = len(scope_ids) - start
                break
            list(pool.map(one, scope_ids[start:start + SWEEP_CONCURRENCY]))
    if not deadline.expired():
        pruned = prune_effects(services.db)
        if pruned:
            logger.info(f"[alerts] pruned {pruned} effect records whose story is gone")
    return result
