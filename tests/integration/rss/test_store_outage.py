"""A store fault while one tenant's scope is refreshed is that tenant's failure: the tick
goes on to the other scopes and the alert sweep, and answers 200 with the failure counted
(as the seed isolates every tenant). The faults are real: on Postgres the network to the
store is cut (every open connection closed, a new one gets through); on SQLite another
connection holds the write lock past the busy timeout, until the failure is logged."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest

from sluice.alerts.rules import RulesStore
from sluice.core.services import Services
from sluice.jobs.registry import JOBS
from sluice.jobs.runner import run_job
from sluice.queues.runtime import REGISTRY
from sluice.rss.catalog import peek_scope
from sluice.rss.store import RssStore
from sluice.store import db as db_module
from tests.integration.jobs.test_store_deadline import _through
from tests.providers.feeds import FeedServer
from tests.rss_support import feed_services
from tests.tcp_proxy import StallingProxy

SCOPES = ("scope-a", "scope-b", "scope-c")
FAULTED = "scope-b"


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    yield
    REGISTRY.clear()


class Logged(logging.Handler):
    """Set when a log line holds ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


@pytest.fixture
def faulted_logged() -> Iterator[Logged]:
    handler = Logged(f"tenant ingestion failed for {FAULTED}")
    logging.getLogger("sluice").addHandler(handler)
    yield handler
    logging.getLogger("sluice").removeHandler(handler)


def seed(svc: Services, feeds: FeedServer) -> None:
    store = RssStore(svc.db)
    for scope in SCOPES:
        source = store.add_source(feeds.add_rss(f"/{scope}", items=2))
        store.put_scope(scope, f"tenant-{scope}", (source.id,), "en", True)
    RulesStore(svc).put("scope-c", [{"id": "r1", "match": {"keywords": ["story"]},
                                     "destination": {"channel": "slack",
                                                     "recipient": "C0ALERTS"}}])


def assert_one_tenant_failed_and_the_tick_went_on(svc: Services) -> None:
    outcome = run_job(JOBS["rss-refresh"], svc, "cron_http")
    assert outcome.status == 200, outcome.body
    body = outcome.body
    assert body["tenantIngestion"]["refreshed"] == 2, body["tenantIngestion"]
    assert body["tenantIngestion"]["failed"] == 1 and body["failed"] == 1, body
    assert body["alertSweep"]["tenantsWithRules"] == 1, "the sweep ran"
    assert body["alertSweep"]["evaluated"] == 1 and body["alertSweep"]["failed"] == 0
    assert peek_scope(svc, FAULTED) is None
    assert all(peek_scope(svc, scope) is not None for scope in SCOPES if scope != FAULTED)
    # nothing was charged to the faulted scope's source: its fetch was never recorded
    [source] = RssStore(svc.db).sources_by_ids(RssStore(svc.db).scope(FAULTED).source_ids)
    assert source.consecutive_failures == 0 and source.next_attempt_at is None


@pytest.mark.postgres
def test_a_postgres_cut_in_one_tenants_refresh_is_that_tenants_failure(
        pg_url: str, make_services: Callable[..., Services], feeds: FeedServer,
        faulted_logged: Logged) -> None:
    parts = urlsplit(pg_url)
    with StallingProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        svc = feed_services(make_services, _through(pg_url, proxy))
        seed(svc, feeds)
        feeds.on_request[f"/{FAULTED}"] = proxy.cut  # while its feed is being fetched
        assert_one_tenant_failed_and_the_tick_went_on(svc)
    assert faulted_logged.seen.is_set()


def test_a_sqlite_lock_past_the_busy_timeout_in_one_tenants_refresh_is_its_failure(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer,
        faulted_logged: Logged, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db_module, "BUSY_TIMEOUT_S", 1.0)  # not 30 s of waiting per write
    svc = feed_services(make_services, sqlite_url)
    seed(svc, feeds)
    holders: list[threading.Thread] = []

    def lock_the_database() -> None:
        other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None,
                                check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")  # the write lock, held until the failure is logged

        def release() -> None:
            faulted_logged.seen.wait(30)
            other.execute("ROLLBACK")
            other.close()

        holders.append(threading.Thread(target=release))
        holders[-1].start()

    feeds.on_request[f"/{FAULTED}"] = lock_the_database
    assert_one_tenant_failed_and_the_tick_went_on(svc)
    for holder in holders:
        holder.join()
    assert faulted_logged.seen.is_set()
