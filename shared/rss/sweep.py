"""The alert sweep's seam: the tick calls ``run_alert_sweep`` after tenant ingestion.

The sweep itself is another piece of work; until it lands this returns zeros, and the
README says so. It is to read stories through ``shared.rss.catalog.peek_scope``
(build-free) and never trigger a fetch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from shared.core.services import Services
    from shared.jobs.registry import Deadline


class SweepResult(TypedDict):
    tenantsWithRules: int
    evaluated: int
    skippedNoFeedCache: int
    failed: int


def run_alert_sweep(services: Services, deadline: Deadline) -> SweepResult:
    """Zeros until the alert sweep lands."""
    return {"tenantsWithRules": 0, "evaluated": 0, "skippedNoFeedCache": 0, "failed": 0}
