"""One bad request never stops erasure-purge: a purge the store refuses is that request's
failure, recorded on it with its reason; the other due requests are purged. The request
stays due and the next run tries it again (the attempts are counted on the row), until the
bound: then it is failed, and that pages (the drain-failure metric and the error tracker)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import sentry_sdk

from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.erasure.purge import MAX_PURGE_ATTEMPTS, purge_due
from sluice.erasure.requests import ErasureStatus, ErasureStore
from sluice.jobs.registry import get_job
from sluice.jobs.runner import run_job
from sluice.store.db import utcnow
from sluice.store.deadline import bounded_by
from tests.conftest import REDIS_URL
from tests.integration.erasure.erasure_data import seed_subject
from tests.providers.sentry import SentryIngest


@pytest.fixture
def svc(db_url: str, redis_prefix: str, make_services: Callable[..., Services]) -> Services:
    return make_services(db_url, SLUICE_REDIS_URL=REDIS_URL, SLUICE_REDIS_KEY_PREFIX=redis_prefix)


@pytest.fixture
def sentry() -> Iterator[SentryIngest]:
    with SentryIngest() as ingest:
        yield ingest
    sentry_sdk.get_client().close()
    sentry_sdk.init(dsn=None)


def poison(svc: Services) -> dict[str, str]:
    """Three due requests; the middle one's purge raises (a row elsewhere references it)."""
    store = ErasureStore(svc.db)
    now = utcnow()
    ids = {}
    for i, subject in enumerate(("a", "poison", "c")):
        seed_subject(svc.db, subject, rows=1)
        request, _ = store.create(subject, requested_by="x", grace_days=0,
                                  now=now - timedelta(minutes=3 - i))
        ids[subject] = request.id
    with svc.db.transaction() as tx:  # something else still points at one of its rows
        tx.execute("CREATE TABLE poison_ref (id text REFERENCES ai_usage_ledger (id))")
        tx.execute("INSERT INTO poison_ref (id) VALUES ('poison-l0')")
    return ids


def test_a_purge_the_store_refuses_is_retried_next_run_then_fails(svc: Services) -> None:
    store = ErasureStore(svc.db)
    ids = poison(svc)

    first = purge_due(svc, now=utcnow())

    assert (first["purged"], first["retrying"], first["failed"], first["reason"]) == \
        (2, 1, 0, None)
    request = store.get(ids["poison"])
    assert request.status is ErasureStatus.REQUESTED, "still due: the next run tries it"
    assert request.purge_attempts == 1
    assert "constraint_violation" in (request.last_error or "")
    assert store.get(ids["c"]).status is ErasureStatus.PURGED, "the next one was purged"
    for attempt in range(2, MAX_PURGE_ATTEMPTS + 1):
        again = purge_due(svc, now=utcnow())
        assert again["due"] == 1, f"run {attempt} tries it again"
        [outcome] = again["results"]
        assert outcome["attempts"] == attempt
        last = attempt == MAX_PURGE_ATTEMPTS
        assert (again["failed"], again["retrying"]) == ((1, 0) if last else (0, 1))
    failed = store.get(ids["poison"])
    assert (failed.status, failed.purge_attempts) == (ErasureStatus.FAILED, MAX_PURGE_ATTEMPTS)
    assert purge_due(svc, now=utcnow())["due"] == 0, "bounded: not tried every run forever"


def test_the_retry_that_succeeds_purges_the_request(svc: Services) -> None:
    store = ErasureStore(svc.db)
    ids = poison(svc)
    assert purge_due(svc, now=utcnow())["retrying"] == 1
    with svc.db.transaction() as tx:  # the cause is fixed between two runs
        tx.execute("DROP TABLE poison_ref")

    second = purge_due(svc, now=utcnow())

    assert (second["due"], second["purged"], second["retrying"], second["failed"]) == \
        (1, 1, 0, 0)
    assert store.get(ids["poison"]).status is ErasureStatus.PURGED


def test_only_the_spent_request_pages(svc: Services, sentry: SentryIngest, capsys: Any) -> None:
    svc.reporter = Reporter(sentry_dsn=sentry.dsn, environment="test")
    poison(svc)
    job = get_job("erasure-purge")
    outcomes = [run_job(job, svc, "schedule") for _ in range(MAX_PURGE_ATTEMPTS)]
    sentry_sdk.flush(timeout=5)

    assert [o.outcome for o in outcomes] == ["ok"] * (MAX_PURGE_ATTEMPTS - 1) + ["failures"]
    blobs = [json.loads(line) for line in capsys.readouterr().err.splitlines()
             if line.startswith('{"_aws"')]
    assert [b["DrainFailures"] for b in blobs if "DrainFailures" in b] == [[1.0]]
    pages = [e for e in sentry.of_type("event")
             if "[erasure-purge] drain reported 1 failure(s)" in (
                 e.get("message") or e.get("logentry", {}).get("message", ""))]
    assert len(pages) == 1, "one page, when the attempts are spent"


def test_a_store_outage_costs_no_attempt_and_the_next_run_purges(
        sqlite_url: str, redis_prefix: str, make_services: Callable[..., Services]) -> None:
    """SQLite locked by another writer past the busy timeout: the store, not the request,
    is at fault, so the due requests wait for the next run with their attempts untouched."""
    svc = make_services(sqlite_url, SLUICE_REDIS_URL=REDIS_URL,
                        SLUICE_REDIS_KEY_PREFIX=redis_prefix)
    store = ErasureStore(svc.db)
    seed_subject(svc.db, "u1", rows=1)
    request, _ = store.create("u1", requested_by="x", grace_days=0)
    other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)

    def lock(message: str) -> None:  # once the due list is read: the purge meets the lock
        if not other.in_transaction:
            other.execute("BEGIN IMMEDIATE")

    try:
        with bounded_by(lambda: 1.0):  # each lock wait ends after a second, not 30
            outage = purge_due(svc, now=utcnow(), progress=lock)
    finally:
        other.execute("ROLLBACK")
        other.close()

    assert (outage["deferred"], outage["reason"], outage["failed"], outage["retrying"]) == \
        (1, "store_unavailable", 0, 0)
    waiting = store.get(request.id)
    assert (waiting.status, waiting.purge_attempts) == (ErasureStatus.REQUESTED, 0)
    assert purge_due(svc, now=utcnow())["purged"] == 1
