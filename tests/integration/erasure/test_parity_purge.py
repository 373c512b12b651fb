"""erasure-purge as the reference documents describe it, run as the job through the job
runner on Postgres: due requests purged one transaction at a time in grace order, and a
request cancelled while the run is under way skipped, not failed. A row lock taken by
another connection holds one purge in place, so the test sees what the run does meanwhile."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from sluice.core.services import Services
from sluice.erasure.purge import count_subject
from sluice.erasure.requests import ErasureStore
from sluice.jobs.registry import get_job
from sluice.jobs.runner import RunOutcome, run_job
from sluice.store.db import utcnow
from tests.conftest import REDIS_URL
from tests.integration.erasure.erasure_data import seed_subject

WAIT_S = 30  # the longest the test waits for the run to reach the held row


@pytest.fixture
def svc(pg_url: str, redis_prefix: str, make_services: Callable[..., Services]) -> Services:
    return make_services(pg_url, SLUICE_REDIS_URL=REDIS_URL, SLUICE_REDIS_KEY_PREFIX=redis_prefix)


def due_requests(svc: Services, *subjects: str) -> list[str]:
    """A due request per subject, the first subject's grace ended first."""
    store, now, ids = ErasureStore(svc.db), utcnow(), []
    for n, subject in enumerate(subjects):
        seed_subject(svc.db, subject, rows=1)
        request, _ = store.create(subject, requested_by="dpo", grace_days=0,
                                  now=now - timedelta(minutes=len(subjects) - n))
        ids.append(request.id)
    return ids


@pytest.fixture
def held(pg_url: str) -> Iterator[Callable[[str], None]]:
    """``hold(subject)``: another connection locks the subject's ledger row until the test
    ends (or ``release`` is called on it)."""
    connection = psycopg.connect(pg_url)

    def hold(subject: str) -> None:
        connection.execute("SELECT id FROM ai_usage_ledger WHERE user_id = %s FOR UPDATE",
                           (subject,))

    hold.release = connection.commit  # type: ignore[attr-defined]
    yield hold
    connection.rollback()
    connection.close()


def run_in_background(svc: Services) -> tuple[threading.Thread, list[RunOutcome]]:
    outcomes: list[RunOutcome] = []
    thread = threading.Thread(target=lambda: outcomes.append(
        run_job(get_job("erasure-purge"), svc, "schedule")))
    thread.start()
    return thread, outcomes


def wait_for_a_blocked_purge(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as watcher:
        until = time.monotonic() + WAIT_S
        while time.monotonic() < until:
            row = watcher.execute(  # this test's database only: the server is shared
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'").fetchone()
            if row and row[0]:
                return
            time.sleep(0.05)
    raise AssertionError("no purge waited on the held row")


def test_due_requests_are_purged_one_transaction_at_a_time_in_grace_order(
        svc: Services, pg_url: str, held: Any) -> None:
    ids = due_requests(svc, "a", "b", "c")
    held("b")
    thread, outcomes = run_in_background(svc)
    wait_for_a_blocked_purge(pg_url)
    # b's purge waits: a (due first) is purged already, c (due last) not begun
    assert count_subject(svc, "a")["ai_usage_ledger"] == 0
    assert count_subject(svc, "c")["ai_usage_ledger"] == 1
    held.release()
    thread.join(WAIT_S)
    [outcome] = outcomes
    assert (outcome.body["due"], outcome.body["purged"], outcome.body["failed"]) == (3, 3, 0)
    assert [r["id"] for r in outcome.body["results"]] == ids
    assert all(count_subject(svc, s)["ai_usage_ledger"] == 0 for s in "abc")


def test_a_request_cancelled_while_the_run_is_under_way_is_skipped_not_failed(
        svc: Services, pg_url: str, held: Any) -> None:
    first, _, cancelled = due_requests(svc, "a", "b", "c")
    held("a")
    thread, outcomes = run_in_background(svc)
    wait_for_a_blocked_purge(pg_url)
    ErasureStore(svc.db).cancel(cancelled)  # an operator, while a's purge waits
    held.release()
    thread.join(WAIT_S)
    [outcome] = outcomes
    assert outcome.outcome == "ok", "a cancelled request pages nobody"
    body = outcome.body
    assert (body["due"], body["purged"], body["failed"], body["skipped"]) == (3, 2, 0, 1)
    assert body["results"][0]["id"] == first
    assert body["results"][-1] == {"id": cancelled, "status": "skipped", "tables": {}}
    assert count_subject(svc, "c")["ai_usage_ledger"] == 1, "c's data is kept"
