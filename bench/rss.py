"""The rss tick: 200 tenant scopes over 10 source sets of 20 feeds each, served on
127.0.0.1 by the tests' feed server (25 items a feed, about 17 kB), on SQLite.

Sluice's tick (one build per source set and locale, each feed fetched once a tick,
conditional requests on the next) against a naive tick that builds every scope on its
own with unconditional requests. The naive tick keeps no state, so every one of its
ticks costs the same; Sluice's is measured cold (first tick) and warm (the next one).
Both fetch with the same pool of 8 and parse with the same parser. Then parse
throughput (stories/s) of Sluice's parser against bare ``feedparser.parse`` on the
same documents: the feeds above (plain RSS 2.0, read without feedparser), and as many
Atom documents of the same size (read by feedparser).
"""

from __future__ import annotations

import io
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import Row, row

SETS = int(os.environ.get("SLUICE_BENCH_RSS_SETS", "10"))
FEEDS_PER_SET = int(os.environ.get("SLUICE_BENCH_RSS_FEEDS_PER_SET", "20"))
SCOPES = int(os.environ.get("SLUICE_BENCH_RSS_SCOPES", "200"))
ITEMS = 25
CONCURRENCY = 8
ENV = {"SLUICE_FEED_ALLOW_HOSTS": "127.0.0.1", "SLUICE_RSS_FETCH_CONCURRENCY": str(CONCURRENCY),
       "SLUICE_RSS_PER_HOST_CONNECTIONS": str(CONCURRENCY)}


def _services(directory: str) -> Any:
    from sluice.core.services import Services
    from sluice.core.settings import Settings
    from sluice.store.db import open_database
    from sluice.store.migrate import migrate

    url = f"sqlite:///{directory}/bench.db"
    migrate(open_database(url))
    return Services.from_settings(Settings.from_env({**ENV, "SLUICE_DATABASE_URL": url}))


def _seed(services: Any, feeds: Any) -> list[str]:
    from sluice.rss.store import RssStore

    store = RssStore(services.db)
    sets = [tuple(store.add_source(feeds.add_rss(f"/s{k}/f{j}", items=ITEMS,
                                                 summary_words=60)).id
                  for j in range(FEEDS_PER_SET)) for k in range(SETS)]
    scope_ids = [f"scope-{n:03d}" for n in range(SCOPES)]
    for n, scope_id in enumerate(scope_ids):
        store.put_scope(scope_id, f"tenant-{n}", sets[n % SETS], "en", True)
    return scope_ids


def _sluice_tick(services: Any, clock: Any, scope_ids: list[str]) -> tuple[float, dict[str, int]]:
    from sluice.rss.catalog import TickMemo
    from tests.rss_support import catalog

    started = time.perf_counter()
    with catalog(services, clock, memo=TickMemo()) as cat:
        for scope_id in scope_ids:
            cat.refresh_scope(scope_id, force=True)
        counters = cat.counters.to_json()
    return time.perf_counter() - started, counters


def _naive_tick(services: Any, scope_ids: list[str]) -> tuple[float, dict[str, int]]:
    """Per scope: fetch every feed (no validators), parse, merge and store its own build."""
    import httpx

    from sluice.rss.catalog import MAX_BUILD_STORIES
    from sluice.rss.parse import parse_feed
    from sluice.rss.store import CatalogBuild, RssStore
    from sluice.store.db import utcnow

    store = RssStore(services.db)
    sources = {s.id: s for s in store.sources()}
    counters = {"builds": 0, "fetches": 0, "bytesParsed": 0}
    started = time.perf_counter()
    with httpx.Client(timeout=10, trust_env=False,
                      limits=httpx.Limits(max_connections=CONCURRENCY)) as client, \
            ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
        def fetch(source_id: str) -> tuple[int, list[Any]]:
            body = client.get(sources[source_id].url).content
            return len(body), parse_feed(body, source_id)

        for scope_id in scope_ids:
            scope = store.scope(scope_id)
            stories: dict[str, Any] = {}
            for size, parsed in pool.map(fetch, scope.source_ids):
                counters["fetches"] += 1
                counters["bytesParsed"] += size
                for story in parsed:
                    stories.setdefault(story.id, story)
            ordered = sorted(stories.values(), key=lambda s: s.published_at, reverse=True)
            store.save_build(CatalogBuild(f"naive:{scope_id}", scope.source_ids, scope.locale,
                                          utcnow(), tuple(ordered[:MAX_BUILD_STORIES])),
                             _ttl())
            counters["builds"] += 1
    return time.perf_counter() - started, counters


def _ttl() -> Any:
    from datetime import timedelta

    return timedelta(hours=1)


def _parse_throughput(documents: list[bytes]) -> tuple[float, float]:
    import feedparser  # type: ignore[import-untyped]

    from sluice.rss.parse import parse_feed

    def ours() -> int:
        return sum(len(parse_feed(doc, "bench")) for doc in documents)

    def bare() -> int:
        return sum(len(feedparser.parse(io.BytesIO(doc)).entries) for doc in documents)

    rates: dict[str, list[float]] = {"ours": [], "bare": []}
    for _ in range(3):  # interleaved, so a busy moment hurts both alike
        for name, fn in (("ours", ours), ("bare", bare)):
            started = time.perf_counter()
            count = fn()
            rates[name].append(count / (time.perf_counter() - started))
    return max(rates["ours"]), max(rates["bare"])


def run() -> list[Row]:
    from tests.providers.feeds import FeedServer, atom_document
    from tests.rss_support import FakeClock

    scratch = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=scratch) as directory, FeedServer() as feeds:
        services = _services(directory)
        try:
            scope_ids = _seed(services, feeds)
            clock = FakeClock()
            cold_s, cold = _sluice_tick(services, clock, scope_ids)
            clock.advance(600)
            warm_s, warm = _sluice_tick(services, clock, scope_ids)
            naive_s, naive = _naive_tick(services, scope_ids)
            documents = [feed.body for feed in list(feeds.feeds.values())[:40]]
        finally:
            services.close()
    assert cold["builds"] == warm["builds"] == SETS, (cold, warm)
    assert warm["notModified"] == SETS * FEEDS_PER_SET, warm
    ours, bare = _parse_throughput(documents)
    ours_atom, bare_atom = _parse_throughput(
        [atom_document(f"wire{n}", ITEMS) for n in range(len(documents))])
    setup = f"{SCOPES} scopes, {SETS} sets x {FEEDS_PER_SET} feeds of {ITEMS} items"
    work_cold = (naive["fetches"] + naive["builds"]) / (cold["fetches"] + cold["builds"])
    return [
        row("rss tick: builds", cold["builds"], naive["builds"], "builds/tick", False,
            note=setup),
        row("rss tick: fetches (cold)", cold["fetches"], naive["fetches"], "requests/tick",
            False, note=f"work (fetches + builds) {work_cold:.1f}x less"),
        row("rss tick: fetches answered 304 (warm)", warm["notModified"], 0, "of requests", True,
            note=f"{warm['fetches']} conditional requests, every one 304"),
        row("rss tick: bytes parsed (cold)", cold["bytesParsed"], naive["bytesParsed"],
            "bytes/tick", False),
        row("rss tick: bytes parsed (warm)", warm["bytesParsed"], naive["bytesParsed"],
            "bytes/tick", False, note="a 304 costs no parse"),
        row("rss tick: wall time (cold)", cold_s, naive_s, "s", False,
            note="same fetch pool and parser"),
        row("rss tick: wall time (warm)", warm_s, naive_s, "s", False),
        row("rss parse throughput (RSS 2.0)", ours, bare, "stories/s", True,
            note="parse_feed (plain RSS 2.0 reader + nh3) vs bare feedparser.parse"),
        row("rss parse throughput (Atom)", ours_atom, bare_atom, "stories/s", True,
            note="parse_feed (feedparser + nh3) vs bare feedparser.parse"),
    ]
