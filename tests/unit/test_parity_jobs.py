"""Facts of the seed-parity rows on the scheduled surface, the rss tick, the other four
jobs and after() ([jobs]) that the tests the rows named before did not show, and the
numbers those rows state, checked against the code."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sentry_sdk

from tests.unit.test_seed_parity import numbers, row

# --- the scheduled surface ---------------------------------------------------------------


def test_the_pipeline_flag_defaults_off(sqlite_url: str, make_services: Any) -> None:
    from sluice.store.flags import FLAGS, FlagStore

    services = make_services(sqlite_url)
    assert FLAGS["rssQueuePipeline"].default is False
    assert FlagStore(services.state).enabled("rssQueuePipeline") is False
    assert "`rssQueuePipeline` defaults to off" in row("Background work runs three ways")[2]


def test_the_five_routes_are_the_documents() -> None:
    from sluice.jobs.registry import JOBS

    behaviour, _where, parity, _tests = row("The five jobs' routes")
    named = re.findall(r"`(/api/[^`]+)`", behaviour)
    assert len(named) == 5 and parity.startswith("same")
    sluice_jobs = JOBS.using(()).values()  # Sluice's own deployment: every pack
    routes = {job.route for job in sluice_jobs}
    assert set(named) <= routes
    # the two Sluice adds are the addition's two
    added = {job.name for job in sluice_jobs if job.route not in named}
    assert added == {"delivery-drain", "history-sample"}
    assert all(f"`{name}`" in row("Five cron jobs")[2] for name in added)


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
    assert row("Sentry cron check-ins")[2].startswith("same")


# --- rss-refresh --------------------------------------------------------------------------


class _RecordingCatalog:
    """A catalog that records what the tick asks of it (no store, no fetch)."""

    def __init__(self, calls: list[tuple[Any, ...]]) -> None:
        from sluice.rss.catalog import Counters

        self.calls = calls
        self.counters = Counters()
        self.announce_now = False
        self.in_flight = 0

    def refresh_global(self, *, force: bool = True, rebuild: bool = False) -> Any:
        from sluice.rss.catalog import Refreshed

        self.calls.append(("global", force, rebuild))
        return Refreshed("built", None)

    def refresh_scope(self, scope_id: str, *, force: bool = True) -> Any:
        from sluice.rss.catalog import Refreshed

        self.in_flight += 1
        assert self.in_flight == 1, "one scope's build at a time"
        self.calls.append(("scope", scope_id, force))
        self.in_flight -= 1
        return Refreshed("built", None)

    def current_builds(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def test_the_tick_refreshes_global_then_each_scope_forced_then_sweeps(
        sqlite_url: str, make_services: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.jobs.registry import Deadline
    from sluice.rss import tick
    from sluice.rss.store import RssStore
    from sluice.rss.sweep import sweep_unavailable

    services = make_services(sqlite_url)
    calls: list[tuple[Any, ...]] = []

    def sweep(services: Any, deadline: Any, *, builds: Any = None) -> Any:
        calls.append(("sweep",))
        return {**sweep_unavailable(services, deadline), "failed": 0}

    monkeypatch.setattr(tick, "resolve_alert_sweep", lambda: sweep)
    scopes = ["a", "b", "c"]
    monkeypatch.setattr(RssStore, "completed_scope_ids", lambda self: list(scopes))
    started = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    offset = tick.rotation_offset(int(started.timestamp() * 1000), len(scopes))

    body = tick.refresh_tick(services, tenant_ingestion=True, deadline=Deadline(60),
                             started_at=started, catalog=_RecordingCatalog(calls))  # type: ignore[arg-type]
    rotated = scopes[offset:] + scopes[:offset]
    assert calls == [("global", True, False), *[("scope", s, True) for s in rotated],
                     ("sweep",)]
    assert (body["published"], body["pipelineEnabled"], body["inlineRefreshed"]) == (
        False, False, True)

    calls.clear()  # the admin POST: the global catalog rebuilt, no tenant, the same sweep
    tick.refresh_tick(services, tenant_ingestion=False, manual=True, deadline=Deadline(60),
                      started_at=started, catalog=_RecordingCatalog(calls))  # type: ignore[arg-type]
    assert calls == [("global", True, True), ("sweep",)]


def test_the_failure_lines_are_the_messages_of_json_records_on_stderr() -> None:
    from sluice.core.observe import logger

    line = "[alerts] sweep evaluation failed for scope-1: boom"
    record = logging.LogRecord("sluice", logging.ERROR, __file__, 1, line, (), None)
    # the handler is a stream handler on stderr (sluice.core.observe: sys.stderr at import)
    assert type(logger.registered_handler) is logging.StreamHandler
    assert json.loads(logger.registered_formatter.format(record))["message"] == line
    for prefix in ("Sweep failures are isolated", "Failures are isolated per tenant"):
        assert "the `message` of a JSON log record on stderr" in row(prefix)[2], prefix


# --- metering-flush, ledger-redrive, state-cleanup, erasure-purge -----------------------


def test_the_numbers_of_the_four_jobs_rows() -> None:
    from sluice.erasure.purge import BATCH, MAX_PURGE_ATTEMPTS
    from sluice.jobs.registry import get_job
    from sluice.store.redis_clients import (
        LEDGER_RETRY_DLQ,
        LEDGER_RETRY_PROCESSING,
        LEDGER_RETRY_QUEUE,
    )

    # 100 rows a run every 5 minutes: the seed's flush caps at 28,800 rows a day
    flush = get_job("metering-flush")
    assert flush.schedule == "rate(5 minutes)"
    [seed_limit] = numbers(row("`flushAiMeteringOutbox")[0], r"limit = (\d+)")
    [a_day] = numbers(row("`flushAiMeteringOutbox")[2], r"caps the flush at ([\d,]+) rows a day")
    assert a_day == seed_limit * 24 * 60 / 5
    # the three lists
    [lists] = re.findall(r"`(ai:ledger:retry:\{[^}]+\})`", row("Three lists")[1])
    base, _, names = lists.partition("{")
    assert [base + n for n in names.rstrip("}").split(",")] == [
        LEDGER_RETRY_QUEUE, LEDGER_RETRY_PROCESSING, LEDGER_RETRY_DLQ]
    # erasure-purge: hourly, at most BATCH requests a run, MAX_PURGE_ATTEMPTS runs
    purge = get_job("erasure-purge")
    assert purge.schedule == "rate(1 hour)"
    assert "hourly" in row("erasure-purge runs once a day")[2]
    assert numbers(row("erasure-purge executes the requests")[2],
                   r"at most (\d+) due requests \(`BATCH`\)") == [BATCH]
    words = {"one": 1, "two": 2, "three": 3, "four": 4}
    [again] = re.findall(r"the next (\w+) runs try it again", row("A purge that raised")[2])
    assert words[again] == MAX_PURGE_ATTEMPTS - 1


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
    assert "`ledger-redrive`'s, not the seed's `ai-ledger-redrive`" in row(
        "`deadLettered` escalates")[2]
    assert "(`erasure-purge`, not the seed's `gdpr-erasure-purge`" in row("Failures page")[2]


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
    parity = row("The answer's keys")[2]
    assert "difference: `tenantIngestion.refreshed` counts only the scopes whose build" in parity


def test_state_cleanup_stops_at_its_deadline_and_the_next_run_goes_on(
        sqlite_url: str, make_services: Any) -> None:
    """The seed deletes every expired row in one statement; Sluice in batches until the
    run's deadline, and the next run deletes the rest. Judged by counting the rows."""
    from sluice.jobs.cleanup import DEFAULT_BATCH_SIZE, cleanup_state
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
    assert numbers(row("Deletes `platform_state` rows")[2],
                   r"batches of ([\d,]+) rows.*its (\d+) s budget") == [
        DEFAULT_BATCH_SIZE, cleanup.budget_s]


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
    assert "`purged` and `failed` also count the requests" in row(
        "Returns `{due, purged, failed, results, processedAt}`")[2]
