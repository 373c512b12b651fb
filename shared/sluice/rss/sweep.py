"""The alert sweep's seam: the tick calls the function named by ``ALERT_SWEEP_TARGET``
after tenant ingestion.

The sweep lives above this package (``sluice.alerts``), which rss never imports by
name: the target is a ``"module:function"`` string resolved with importlib, as job
targets and the topic table are. Resolving it imports ``sluice.alerts``, which also
registers its listener on ``sluice.rss.catalog.on_new_stories``; the catalog resolves it
before announcing new stories, so a process that builds without ticking (the
``rss.ingest`` consumer, an admin refresh) has the listener too.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Protocol, TypedDict

from sluice.core.extensions import packs_on

if TYPE_CHECKING:
    from sluice.core.services import Services
    from sluice.jobs.registry import Deadline
    from sluice.rss.store import CatalogBuild

# The sweep: a "module:function" taking (services, deadline, builds=None) and returning
# SweepResult (``Sweep``).
ALERT_SWEEP_TARGET = "sluice.alerts.sweep:run_alert_sweep"


class SweepResult(TypedDict):
    tenantsWithRules: int  # scopes with a rules row holding at least one enabled rule
    evaluated: int  # of those, scopes whose rules were tested against their build
    skippedNoFeedCache: int  # scopes with rules but no stored build (never built here)
    failed: int  # scopes whose evaluation raised (logged, the others went on)
    skippedDeadline: int  # scopes not reached before the run's deadline
    evaluations: int  # (rule, story) pairs tested
    enqueued: int  # new delivery entries


class Sweep(Protocol):
    def __call__(self, services: Services, deadline: Deadline, *,
                 builds: Mapping[str, CatalogBuild] | None = None) -> SweepResult:
        """``builds``: the builds the caller holds, by key, current as of its run (the
        tick's own): used instead of reading them again."""
        ...


def resolve_alert_sweep() -> Sweep | None:
    """The sweep ``ALERT_SWEEP_TARGET`` names (ImportError / AttributeError if none), or
    None in a deployment that leaves the alerts pack out (nothing is imported then)."""
    if "alerts" not in packs_on():
        return None
    return _resolve(ALERT_SWEEP_TARGET)


@cache
def _resolve(target: str) -> Sweep:
    module, _, attr = target.partition(":")
    sweep: Sweep = getattr(importlib.import_module(module), attr)
    return sweep


def sweep_unavailable(services: Services, deadline: Deadline, *,
                      builds: Mapping[str, CatalogBuild] | None = None) -> SweepResult:
    """What the tick reports when the target cannot be resolved: one failure, nothing
    evaluated."""
    return {"tenantsWithRules": 0, "evaluated": 0, "skippedNoFeedCache": 0, "failed": 1,
            "skippedDeadline": 0, "evaluations": 0, "enqueued": 0}
