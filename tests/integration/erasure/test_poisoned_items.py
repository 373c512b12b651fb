"""One bad request never stops erasure-purge: a purge the store refuses is that request's
failure, recorded on it with its reason, counted in the run's ``failed`` and paged (the
drain-failure metric and the error tracker) by the run it failed in; the other due requests
are purged. The request stays due, so every later run tries it again (the attempts are
counted on the row), paging each run it fails again, until it succeeds."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sentry_sdk
from fastapi.testclient import TestClient

from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.erasure.purge import purge_due
from sluice.erasure.requests import ErasureStatus, ErasureStore
from sluice.http.app import create_app
from sluice.store.db import MIGRATIONS_DIR, utcnow
from sluice.store.deadline import bounded_by
from tests.conftest import CRON_SECRET, REDIS_URL
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


MIGRATION = "0029_erasure_raised_purges_due"
RUNS = 4  # runs the poisoned request fails in, one after another


def test_a_purge_the_store_refuses_fails_its_run_and_is_retried_every_run(
        svc: Services) -> None:
    store = ErasureStore(svc.db)
    ids = poison(svc)

    first = purge_due(svc, now=utcnow())

    assert (first["purged"], first["failed"], first["reason"]) == (2, 1, None)
    request = store.get(ids["poison"])
    assert request.status is ErasureStatus.REQUESTED, "still due: the next run tries it"
    assert request.purge_attempts == 1
    assert "constraint_violation" in (request.last_error or "")
    assert store.get(ids["c"]).status is ErasureStatus.PURGED, "the next one was purged"
    for attempt in range(2, RUNS + 1):
        again = purge_due(svc, now=utcnow())
        assert again["due"] == 1, f"run {attempt} tries it again"
        [outcome] = again["results"]
        assert (outcome["status"], outcome["attempts"]) == ("failed", attempt)
        assert again["failed"] == 1
    waiting = store.get(ids["poison"])
    assert (waiting.status, waiting.purge_attempts) == (ErasureStatus.REQUESTED, RUNS)


def test_the_retry_that_succeeds_purges_the_request(svc: Services) -> None:
    store = ErasureStore(svc.db)
    ids = poison(svc)
    assert purge_due(svc, now=utcnow())["failed"] == 1
    with svc.db.transaction() as tx:  # the cause is fixed between two runs
        tx.execute("DROP TABLE poison_ref")

    second = purge_due(svc, now=utcnow())

    assert (second["due"], second["purged"], second["failed"]) == (1, 1, 0)
    assert store.get(ids["poison"]).status is ErasureStatus.PURGED


def test_each_run_whose_purge_raises_pages(svc: Services, sentry: SentryIngest,
                                            capsys: Any) -> None:
    """Through the cron route: the run that fails pages (the drain-failure metric and the
    error tracker), and so does every later run that fails again; the fixed run does not."""
    svc.reporter = Reporter(sentry_dsn=sentry.dsn, environment="test")
    ids = poison(svc)
    client = TestClient(create_app(svc), raise_server_exceptions=False)
    cron = {"authorization": f"Bearer {CRON_SECRET}"}

    answers = [client.get("/api/admin/erasure/purge", headers=cron) for _ in range(RUNS)]
    with svc.db.transaction() as tx:
        tx.execute("DROP TABLE poison_ref")
    fixed = client.get("/api/admin/erasure/purge", headers=cron)
    sentry_sdk.flush(timeout=5)

    assert [a.status_code for a in answers] == [200] * RUNS, answers[0].text
    assert [a.json()["failed"] for a in answers] == [1] * RUNS
    assert (fixed.json()["purged"], fixed.json()["failed"]) == (1, 0)
    assert ErasureStore(svc.db).get(ids["poison"]).status is ErasureStatus.PURGED
    blobs = [json.loads(line) for line in capsys.readouterr().err.splitlines()
             if line.startswith('{"_aws"')]
    assert [b["DrainFailures"] for b in blobs if "DrainFailures" in b] == [[1.0]] * RUNS
    pages = [e for e in sentry.of_type("event")
             if "[erasure-purge] drain reported 1 failure(s)" in (
                 e.get("message") or e.get("logentry", {}).get("message", ""))]
    assert len(pages) == RUNS, "one page for each run that failed, from the first"


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

    assert (outage["deferred"], outage["reason"], outage["failed"]) == \
        (1, "store_unavailable", 0)
    waiting = store.get(request.id)
    assert (waiting.status, waiting.purge_attempts) == (ErasureStatus.REQUESTED, 0)
    assert purge_due(svc, now=utcnow())["purged"] == 1


def test_requests_failed_by_the_old_attempt_bound_are_due_again(svc: Services) -> None:
    """Migration 0029: a request the old bound failed (failed, never purged) is due again and
    the next run tries it; a request failed after its purge committed is left as it was."""
    store = ErasureStore(svc.db)
    ids = poison(svc)
    with svc.db.transaction() as tx:
        tx.execute("DROP TABLE poison_ref")
        tx.execute("UPDATE data_erasure_requests SET status = 'failed', purge_attempts = 3 "
                   "WHERE id = :id", {"id": ids["poison"]})
        tx.execute("UPDATE data_erasure_requests SET status = 'failed', purged_at = :now "
                   "WHERE id = :id", {"id": ids["a"], "now": utcnow()})

    svc.db.run_script((Path(MIGRATIONS_DIR) / f"{MIGRATION}.{svc.db.dialect}.sql").read_text())

    assert store.get(ids["poison"]).status is ErasureStatus.REQUESTED
    assert store.get(ids["a"]).status is ErasureStatus.FAILED
    run = purge_due(svc, now=utcnow())
    assert {r["id"] for r in run["results"] if r["status"] == "purged"} >= {ids["poison"]}
    assert store.get(ids["poison"]).status is ErasureStatus.PURGED
