"""Tenant ingestion as a function of an injected clock: budget, rotation, isolation."""

from __future__ import annotations

import pytest

from sluice.core.errors import TransientStoreError
from sluice.jobs.registry import Deadline
from sluice.rss.tick import ROTATION_WINDOW_MS, ingest_tenant_scopes, rotation_offset
from tests.rss_support import FakeClock

SCOPES = [f"scope-{i}" for i in range(6)]


def run(clock: FakeClock, refresh_s: float, budget_s: float, *, started_at_ms: int = 0,
        scopes: list[str] = SCOPES, fail: frozenset[str] = frozenset()
        ) -> tuple[dict[str, int], list[str]]:
    seen: list[str] = []

    def refresh(scope_id: str) -> None:
        seen.append(scope_id)
        clock.advance(refresh_s)
        if scope_id in fail:
            raise RuntimeError(f"{scope_id} exploded")

    result = ingest_tenant_scopes(lambda: list(scopes), refresh, started_at_ms=started_at_ms,
                                  budget=Deadline(budget_s, clock=clock.monotonic),
                                  monotonic=clock.monotonic)
    return dict(result), seen


def test_scopes_not_reached_before_the_budget_are_counted_not_retried() -> None:
    clock = FakeClock()
    result, seen = run(clock, refresh_s=100, budget_s=240)
    # GIVEN 100 s per scope and 240 s: scopes start at 0, 100, 200; the fourth would start
    # at 300 s, past the budget.
    assert seen == SCOPES[:3]
    assert result == {"tenantScopes": 6, "refreshed": 3, "shared": 0, "throttled": 0,
                      "locked": 0, "failed": 0, "skippedTimeBudget": 3, "elapsedMs": 300_000}


def test_everything_is_refreshed_when_the_budget_allows() -> None:
    result, seen = run(FakeClock(), refresh_s=1, budget_s=240)
    assert seen == SCOPES and result["skippedTimeBudget"] == 0 and result["refreshed"] == 6


@pytest.mark.parametrize(("window", "offset"), [(0, 0), (1, 1), (5, 5), (6, 0), (13, 1)])
def test_the_rotation_offset_moves_one_scope_every_ten_minutes(window: int, offset: int) -> None:
    started = window * ROTATION_WINDOW_MS + 599_999
    assert rotation_offset(started, len(SCOPES)) == offset
    _, seen = run(FakeClock(), refresh_s=1, budget_s=240, started_at_ms=started)
    assert seen == SCOPES[offset:] + SCOPES[:offset]


def test_rotation_lets_the_tail_of_a_long_list_be_reached() -> None:
    reached: set[str] = set()
    for window in range(6):
        _, seen = run(FakeClock(), refresh_s=100, budget_s=150,
                      started_at_ms=window * ROTATION_WINDOW_MS)
        reached.update(seen)
    assert reached == set(SCOPES)
    assert rotation_offset(123, 0) == 0


def test_a_failing_scope_is_counted_and_logged_and_the_rest_go_on(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("ERROR", logger="sluice")
    result, seen = run(FakeClock(), refresh_s=1, budget_s=240,
                       fail=frozenset({"scope-1", "scope-4"}))
    assert seen == SCOPES
    assert (result["refreshed"], result["failed"]) == (4, 2)
    lines = [r.getMessage() for r in caplog.records if "tenant ingestion failed" in r.getMessage()]
    assert lines == ["[rss-refresh] tenant ingestion failed for scope-1: scope-1 exploded",
                     "[rss-refresh] tenant ingestion failed for scope-4: scope-4 exploded"]


def test_a_failing_listing_yields_no_scopes_not_an_error(
        caplog: pytest.LogCaptureFixture) -> None:
    def listing() -> list[str]:
        raise TransientStoreError("postgres: connection refused")

    caplog.set_level("ERROR", logger="sluice")
    result = ingest_tenant_scopes(listing, lambda s: None, started_at_ms=0,
                                  budget=Deadline(10))
    assert result["tenantScopes"] == 0 and result["refreshed"] == result["failed"] == 0
    assert any("listing tenant scopes failed" in r.getMessage() for r in caplog.records)
