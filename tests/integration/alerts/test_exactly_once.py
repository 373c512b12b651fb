"""Exactly one delivery per (rule, story) on Postgres under concurrency: evaluations in
threads of one process, and two processes sweeping and evaluating at the same time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from threading import Barrier

import pytest

from sluice.alerts.evaluate import evaluate_new_stories
from sluice.alerts.rules import RulesStore
from sluice.alerts.sweep import run_alert_sweep
from sluice.core.services import Services
from sluice.delivery.store import DeliveryStore
from sluice.jobs.registry import Deadline
from sluice.rss.catalog import peek_scope
from sluice.rss.store import RssStore
from tests.conftest import BASE_ENV, ROOT
from tests.providers.feeds import FeedServer
from tests.rss_support import FEED_ENV, catalog, feed_services

pytestmark = [pytest.mark.postgres]
RULES = [{"id": "odd", "match": {"keywords": ["story 1", "story 3", "story 5"]},
          "destination": {"channel": "slack", "recipient": "C0ALERTS"}},
         {"id": "all", "match": {"keywords": ["story"]},
          "destination": {"channel": "telegram", "recipient": "1001"}}]
EXPECTED = 3 + 8  # 'odd' matches stories 1, 3, 5; 'all' matches the eight


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


def prepare(svc: Services, feeds: FeedServer) -> None:
    store = RssStore(svc.db)
    source = store.add_source(feeds.add_rss("/a", items=8)).id
    store.put_scope("a", "tenant-a", (source,), "en", True)
    with catalog(svc) as cat:
        cat.refresh_scope("a")
    RulesStore(svc).put("a", RULES)


def test_concurrent_evaluations_in_threads_enqueue_each_match_once(
        pg_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, pg_url)
    prepare(svc, feeds)
    build = peek_scope(svc, "a")
    assert build is not None
    barrier = Barrier(8)

    def work(n: int) -> int:
        barrier.wait()
        if n % 2:
            return run_alert_sweep(svc, Deadline(60))["enqueued"]
        return evaluate_new_stories(svc, build, list(build.stories), ["a"]).enqueued

    with ThreadPoolExecutor(max_workers=8) as pool:
        created = sum(pool.map(work, range(8)))
    entries = DeliveryStore(svc.db).list(limit=500)
    assert created == EXPECTED
    assert len(entries) == EXPECTED
    assert len({e.idempotency_key for e in entries}) == EXPECTED


def test_two_processes_sweeping_at_once_enqueue_each_match_once(
        pg_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, pg_url)
    prepare(svc, feeds)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "CRON_"))}
    env.update({**BASE_ENV, **FEED_ENV, "SLUICE_DATABASE_URL": pg_url})
    procs = [subprocess.Popen([sys.executable, "-m", "tests.integration.alerts.sweeper"],
                              env=env, cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for _ in range(2)]
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outputs = [proc.communicate(timeout=90)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    created = sum(json.loads(out.strip().splitlines()[-1])["enqueued"] for out in outputs)
    entries = DeliveryStore(svc.db).list(limit=500)
    assert created == EXPECTED and len(entries) == EXPECTED

