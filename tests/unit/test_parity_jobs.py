"""Facts of the seed-parity rows on the scheduled surface, the rss tick, the other four
jobs and after() ([jobs]) that the tests the rows named before did not show, and the
numbers those rows state, checked against the code."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sentry_sdk

# --- the scheduled surface ---------------------------------------------------------------


@pytest.fixture
def sentry() -> Iterator[Any]:
    from tests.providers.sentry import SentryIngest

    with SentryIngest() as ingest:
        yield ingest
    sentry_sdk.get_client().close()
    sentry_sdk.init(dsn=None)


def test_check_ins_carry_each_jobs_monitor_config(sentry: Any, sqlite_url: str,
                                                 make_services: Any) -> None:
    """Vercel creates a monitor per cron from vercel.json; Sluice's check-ins name the
    job's slug and carry its ``monitor_config`` (schedule, margin, longest run) from the
    job table, so Sentry creates the monitor from them. Judged by what the Sentry ingest
    received, against the schedules written out here."""
    from sluice.core.observe import Reporter
    from sluice.jobs.runner import run_job
    from tests.integration.jobs.test_cron_contract import job

    services = make_services(sqlite_url)
    services.reporter = Reporter(sentry_dsn=sentry.dsn, environment="test")
    daily = job("record_context", timeout_s=90)  # rate(1 day)
    nightly = job("record_context", timeout_s=60)._replace(
        name="test-nightly", schedule="cron(15 3 ? * 2-6 *)")
    assert run_job(daily, services, "schedule").status == 200
    assert run_job(nightly, services, "schedule").status == 200
    sentry_sdk.flush(timeout=5)
    check_ins = sentry.of_type("check_in")
    assert [(c["monitor_slug"], c["status"]) for c in check_ins] == [
        ("test-record_context", "in_progress"), ("test-record_context", "ok"),
        ("test-nightly", "in_progress"), ("test-nightly", "ok")]
    margin = {"checkin_margin": 5, "timezone": "UTC"}
    assert [c["monitor_config"] for c in check_ins[:2]] == [{
        "schedule": {"type": "interval", "value": 1, "unit": "day"},
        "max_runtime": 2, **margin}] * 2
    # AWS counts weekdays 1-7 from Sunday, crontab 0-6: Monday to Friday is 1-5
    assert [c["monitor_config"] for c in check_ins[2:]] == [{
        "schedule": {"type": "crontab", "value": "15 3 * * 1-5"},
        "max_runtime": 1, **margin}] * 2


# --- rss-refresh --------------------------------------------------------------------------


def test_the_failure_lines_are_the_messages_of_json_records_on_stderr() -> None:
    from sluice.core.observe import logger

    line = "[alerts] sweep evaluation failed for scope-1: boom"
    record = logging.LogRecord("sluice", logging.ERROR, __file__, 1, line, (), None)
    # the handler is a stream handler on stderr (sluice.core.observe: sys.stderr at import)
    assert type(logger.registered_handler) is logging.StreamHandler
    assert json.loads(logger.registered_formatter.format(record))["message"] == line


# --- metering-flush, ledger-redrive, state-cleanup, erasure-purge -----------------------


def test_a_run_purges_at_most_batch_due_requests(
        sqlite_url: str, make_services: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.erasure import purge
    from sluice.erasure.requests import ErasureStore

    monkeypatch.setattr(purge, "BATCH", 2)  # the listing's bound, read at each run
    services = make_services(sqlite_url)
    now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    for n, subject in enumerate(("u1", "u2", "u3")):
        ErasureStore(services.db).create(subject, requested_by="dpo", grace_days=0,
                                         now=now - timedelta(minutes=3 - n))
    first = purge.purge_due(services, now=now)
    assert (first["due"], first["purged"], first["deferred"]) == (2, 2, 0)
    assert ErasureStore(services.db).count_due(now) == 1, "the third waits for the next run"
    assert purge.purge_due(services, now=now)["purged"] == 1


def test_state_cleanup_deletes_an_abandoned_expired_feed_cache(
        sqlite_url: str, make_services: Any) -> None:
    """A build expired more than a day ago is abandoned and deleted, with its expired build
    lease; one expired within the day (the ticks paused) and a live one stay, as does a
    lease still held. Judged by counting the rows, not by the job's result."""
    from sluice.jobs.cleanup import cleanup_state
    from sluice.jobs.registry import Deadline
    from sluice.rss.store import CatalogBuild, RssStore

    services = make_services(sqlite_url)
    store = RssStore(services.db)
    now = datetime.now(UTC)
    # a source set no scope uses any more, built three days ago, expired two days ago
    store.save_build(CatalogBuild("en:abandoned", ("gone-1",), "en", now - timedelta(days=3),
                                  ()), timedelta(days=1))
    store.save_build(CatalogBuild("en:paused", ("p-1",), "en", now - timedelta(hours=30),
                                  ()), timedelta(days=1))  # expired six hours ago
    store.save_build(CatalogBuild("en:live", ("l-1",), "en", now - timedelta(minutes=5),
                                  ()), timedelta(hours=1))
    assert store.acquire_lock("en:abandoned", "old", timedelta(minutes=1),
                              now - timedelta(hours=2))
    assert store.acquire_lock("en:live", "held", timedelta(minutes=5), now)
    result = cleanup_state(services.db, now=now, deadline=Deadline(30))
    with services.db.transaction() as tx:
        builds = {r["key"] for r in tx.fetchall("SELECT key FROM rss_builds", {})}
        locks = {r["key"] for r in tx.fetchall("SELECT key FROM rss_build_locks", {})}
    assert builds == {"en:paused", "en:live"}
    assert locks == {"en:live"}
    assert (result["deletedFeedCaches"], result["deletedBuildLocks"]) == (1, 1)


def test_dead_letters_and_purge_failures_page_under_the_jobs_own_names(
        sqlite_url: str, make_services: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The seed pages as ``ai-ledger-redrive`` and ``gdpr-erasure-purge``; Sluice under each
    job's registry name, which the two rows say."""
    from sluice.billing import ledger_redrive
    from sluice.erasure import purge
    from sluice.jobs.registry import get_job
    from sluice.jobs.runner import run_job

    services = make_services(sqlite_url)
    paged: list[tuple[str, int]] = []
    monkeypatch.setattr(services.reporter, "drain_failures",
                        lambda job, failed, result: paged.append((job, failed)))
    monkeypatch.setattr(ledger_redrive, "run_ledger_redrive",
                        lambda ctx: {"drained": 3, "deadLettered": 2, "errors": []})
    monkeypatch.setattr(purge, "run_erasure_purge", lambda ctx: {"due": 1, "failed": 1})
    for name in ("ledger-redrive", "erasure-purge"):
        assert run_job(get_job(name), services, "cli").outcome == "failures"
    assert paged == [("ledger-redrive", 2), ("erasure-purge", 1)]


# --- the deep re-audit: what a same row's count or answer means -------------------------


def test_refreshed_counts_only_the_builds_the_tick_made() -> None:
    """The seed's ``tenantIngestion.refreshed`` has every scope refreshed; Sluice's only
    the scopes whose build this tick made, the others in ``shared``, ``throttled`` and
    ``locked``. Judged by the counts one tick of five scopes reports."""
    from sluice.jobs.registry import Deadline
    from sluice.rss.catalog import Refreshed
    from sluice.rss.tick import ingest_tenant_scopes

    outcomes = {"a": "built", "b": "shared", "c": "fresh", "d": "throttled", "e": "locked"}
    counts = ingest_tenant_scopes(lambda: list(outcomes),
                                  lambda scope: Refreshed(outcomes[scope], None),  # type: ignore[arg-type]
                                  started_at_ms=0, budget=Deadline(60))
    assert (counts["tenantScopes"], counts["refreshed"], counts["shared"],
            counts["throttled"], counts["locked"], counts["failed"]) == (5, 1, 2, 1, 1, 0)


def test_state_cleanup_stops_at_its_deadline_and_the_next_run_goes_on(
        sqlite_url: str, make_services: Any) -> None:
    """The seed deletes every expired row in one statement; Sluice in batches until the
    run's deadline, and the next run deletes the rest. Judged by counting the rows."""
    from sluice.jobs.cleanup import cleanup_state
    from sluice.jobs.registry import Deadline, get_job

    db = make_services(sqlite_url).db
    now = datetime.now(UTC)
    with db.transaction() as tx:
        tx.executemany("INSERT INTO platform_state (key, value, expires_at, updated_at) "
                       "VALUES (:key, '1', :at, :at)",
                       [{"key": f"expired:{i}", "at": now - timedelta(minutes=1)}
                        for i in range(10)])
    ticks = iter(range(100))
    # the deadline passes after the first batch's check
    first = cleanup_state(db, now=now, deadline=Deadline(1.5, clock=lambda: next(ticks)),
                          batch_size=4)
    assert (first["deleted"], first["deletedHashRecords"], first["failed"]) == (4, 0, 0)
    assert cleanup_state(db, now=now, deadline=Deadline(60), batch_size=4)["deleted"] == 6
    cleanup = get_job("state-cleanup")
    assert cleanup.schedule == "cron(15 3 * * ? *)"  # once a day


def test_a_purge_run_counts_the_requests_it_resumed_in_purged(
        sqlite_url: str, make_services: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request whose sweep failed after its purge committed is settled again by the next
    run, and counted in that run's ``purged`` (or ``failed``) though it is not in its
    ``due``. Judged by the two runs' answers and the request's status."""
    from sluice.core.errors import TransientStoreError
    from sluice.erasure import purge
    from sluice.erasure.requests import ErasureStatus, ErasureStore

    class Down:
        name = "redis-down"

        def count(self, redis: Any, subject: str) -> dict[str, int]:
            raise TransientStoreError("redis down")

        def purge(self, redis: Any, subject: str) -> dict[str, int]:
            raise TransientStoreError("redis down")

    services = make_services(sqlite_url)
    now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    request, _ = ErasureStore(services.db).create("u1", requested_by="dpo", grace_days=0,
                                                  now=now - timedelta(minutes=1))
    monkeypatch.setattr(purge, "EXTERNAL_STORES", (Down(),))
    first = purge.purge_due(services, now=now)
    assert (first["due"], first["purged"], first["failed"]) == (1, 0, 1)
    monkeypatch.setattr(purge, "EXTERNAL_STORES", ())
    second = purge.purge_due(services, now=now)
    assert (second["due"], second["resumed"], second["purged"], second["failed"]) == (
        0, 1, 1, 0)
    assert ErasureStore(services.db).get(request.id).status is ErasureStatus.PURGED
