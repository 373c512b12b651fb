"""The simulator's erasure model against the real request store: a second call naming a
subject whose request is still open is handed that request, and follows it (a regression
of seed 5 over 365 days, which flagged ``erased_in_time`` at day 254.30 for a request
cancelled through the subject's first call)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from bench.simulate.erasure import PURGE_WITHIN, Erasures
from bench.simulate.invariants import Judge
from bench.simulate.world import ErasureCall
from sluice.core.services import Services
from sluice.store.db import utcnow


def _erasures(svc: Services, now: datetime) -> tuple[Erasures, Judge, list[tuple[datetime,
                                                                                ErasureCall]]]:
    judge = Judge(now)
    later: list[tuple[datetime, ErasureCall]] = []
    erasures = Erasures(judge, svc, lambda line: None,
                        reschedule=lambda at, call: later.append((at, call)),
                        windows=[], end=now + timedelta(days=365))
    return erasures, judge, later


def test_a_cancel_through_the_first_call_holds_for_the_second(
        sqlite_url: str, make_services: Callable[..., Services]) -> None:
    svc = make_services(sqlite_url)
    now = utcnow()
    erasures, judge, _ = _erasures(svc, now)
    first = ErasureCall(now, "user-0-3", "org-tenant-0", 3, now + timedelta(days=1))
    second = ErasureCall(now + timedelta(hours=1), "user-0-3", "org-tenant-0", 2, None)
    erasures.request(first)
    erasures.request(second)
    assert erasures.of_call[first] == erasures.of_call[second]  # one request, handed back
    erasures.cancel(first)
    erasures.check_purged(second, now + timedelta(days=2) + PURGE_WITHIN)
    assert judge.violations == []


def test_a_second_call_with_a_shorter_window_is_owed_at_the_requests_end(
        sqlite_url: str, make_services: Callable[..., Services]) -> None:
    svc = make_services(sqlite_url)
    now = utcnow()
    erasures, judge, later = _erasures(svc, now)
    first = ErasureCall(now, "user-1-0", "org-tenant-1", 10, None)
    second = ErasureCall(now + timedelta(hours=1), "user-1-0", "org-tenant-1", 1, None)
    erasures.request(first)
    erasures.request(second)
    own_due = second.at + timedelta(days=1) + PURGE_WITHIN
    erasures.check_purged(second, own_due)  # the request's window runs 9 more days
    assert judge.violations == []
    assert [call for _, call in later] == [second]
    assert later[0][0] >= now + timedelta(days=10) + PURGE_WITHIN
    erasures.check_purged(second, later[0][0])  # owed then, and not purged: a violation
    assert [v.invariant for v in judge.violations] == ["erased_in_time"]
