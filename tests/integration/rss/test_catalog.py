"""Catalog builds on both backends: N scopes over k source sets cost k builds, each source
is fetched once per tick and conditionally on the next; broken publishers are isolated;
the per-scope throttle; build-free peeks; new-story hooks; the cross-instance lock."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from sluice.core.services import Services
from sluice.rss import catalog as catalog_module
from sluice.rss.catalog import DbLock, RedisLock, TickMemo, peek, peek_scope
from sluice.rss.store import CatalogBuild, RssStore, Story
from tests.providers.feeds import FeedServer, rss_document
from tests.rss_support import FakeClock, catalog, feed_services


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer(slow_s=2.0) as server:
        yield server


@pytest.fixture
def svc(db_url: str, make_services: Callable[..., Services]) -> Services:
    return feed_services(make_services, db_url)


def make_sets(store: RssStore, feeds: FeedServer, sets: int, per_set: int,
              shared_source: bool = False) -> list[tuple[str, ...]]:
    common = store.add_source(feeds.add_rss("/common", items=3)).id if shared_source else None
    result = []
    for k in range(sets):
        ids = [store.add_source(feeds.add_rss(f"/set{k}/feed{j}", items=3)).id
               for j in range(per_set)]
        result.append(tuple(ids + ([common] if common else [])))
    return result


def tick(svc: Services, clock: FakeClock, scope_ids: list[str]) -> dict[str, int]:
    with catalog(svc, clock, memo=TickMemo()) as cat:
        for scope_id in scope_ids:
            cat.refresh_scope(scope_id, force=True)
        return cat.counters.to_json()


def test_n_scopes_over_k_sets_cost_k_builds_and_one_fetch_per_source(
        svc: Services, feeds: FeedServer) -> None:
    store = RssStore(svc.db)
    sets = make_sets(store, feeds, sets=3, per_set=4, shared_source=True)
    scope_ids = []
    for n in range(12):  # 12 scopes, 4 per set, two locales only on set 0
        ids = sets[n % 3]
        locale = "de" if n == 9 else "en"
        store.put_scope(f"scope-{n}", f"tenant-{n}", tuple(reversed(ids)) if n % 2 else ids,
                        locale, True)
        scope_ids.append(f"scope-{n}")
    clock = FakeClock()

    first = tick(svc, clock, scope_ids)
    assert first["builds"] == 4  # three sets in "en" and set 0 in "de"
    assert first["shared"] == 8
    assert first["fetches"] == 3 * 4 + 1  # the shared source once, for every set using it
    assert all(count == 1 for count in feeds.hits.values()) and len(feeds.hits) == 13
    assert feeds.conditional.total() == 0

    built = peek_scope(svc, "scope-0")
    assert built is not None and peek_scope(svc, "scope-3") == built
    assert len(built.stories) == 4 * 3 + 3
    assert peek_scope(svc, "scope-9") != built  # same set, another locale: its own build

    clock.advance(600)  # the next tick: every request is conditional, nothing is parsed
    second = tick(svc, clock, scope_ids)
    assert second["builds"] == 4 and second["fetches"] == 13
    assert second["notModified"] == 13 and second["bytesParsed"] == 0
    assert all(count == 2 for count in feeds.hits.values())
    assert feeds.conditional.total() == 13


def test_a_broken_publisher_is_recorded_and_the_build_goes_on(
        svc: Services, feeds: FeedServer) -> None:
    store = RssStore(svc.db)
    good = [store.add_source(feeds.add_rss(f"/ok{i}", items=2)).id for i in range(2)]
    broken = {path: store.add_source(feeds.url + path).id
              for path in ("/malformed", "/slow", "/huge", "/loop", "/to-private", "/limited")}
    store.put_scope("s", "t", tuple(good + list(broken.values())), "en", True)
    clock = FakeClock()
    counters = tick(svc, clock, ["s"])
    assert counters["builds"] == 1 and counters["fetchFailures"] == 6
    build = peek_scope(svc, "s")
    assert build is not None and len(build.stories) == 4
    for path, source_id in broken.items():
        state = store.source(source_id)
        assert state.consecutive_failures == 1 and state.last_error, path
        assert state.next_attempt_at is not None and state.next_attempt_at > clock.now()
    assert store.source(broken["/limited"]).next_attempt_at == clock.now() + timedelta(hours=1)
    assert store.source(broken["/to-private"]).last_error.startswith("refused:")  # type: ignore[union-attr]
    assert store.source(good[0]).last_error is None

    # Backing off (5 min after a first failure, 1 h for the 429): a tick past the scope's
    # throttle does not ask the broken ones again, and a later one does: never given up.
    clock.advance(250)
    hits = dict(feeds.hits)
    again = tick(svc, clock, ["s"])
    assert again["backingOff"] == 6
    assert {p: feeds.hits[p] - hits[p] for p in ("/malformed", "/limited")} == {
        "/malformed": 0, "/limited": 0}
    clock.advance(7200)
    tick(svc, clock, ["s"])
    assert feeds.hits["/malformed"] == hits["/malformed"] + 1
    assert store.source(broken["/malformed"]).consecutive_failures == 2


def test_the_per_scope_throttle_and_reuse_of_a_recent_build(svc: Services,
                                                            feeds: FeedServer) -> None:
    store = RssStore(svc.db)
    [ids] = make_sets(store, feeds, sets=1, per_set=2)
    store.put_scope("a", "t1", ids, "en", True)
    store.put_scope("b", "t2", ids, "en", True)
    clock = FakeClock()
    with catalog(svc, clock) as cat:
        assert cat.refresh_scope("a").outcome == "built"
    with catalog(svc, clock) as cat:  # another tick a minute later
        clock.advance(60)
        assert cat.refresh_scope("a").outcome == "throttled"
        assert cat.refresh_scope("b").outcome == "fresh"  # the set was built a minute ago
    assert sum(feeds.hits.values()) == 2
    clock.advance(svc.settings.rss_scope_min_interval_s)
    with catalog(svc, clock) as cat:
        assert cat.refresh_scope("a").outcome == "built"


def test_peek_never_fetches_and_expired_builds_are_not_served(svc: Services,
                                                              feeds: FeedServer) -> None:
    store = RssStore(svc.db)
    [ids] = make_sets(store, feeds, sets=1, per_set=1)
    store.put_scope("a", "t1", ids, "en", True)
    assert peek_scope(svc, "a") is None and peek_scope(svc, "unknown") is None
    assert sum(feeds.hits.values()) == 0
    past = FakeClock().now() - timedelta(hours=2)
    store.save_build(CatalogBuild("en:old", ids, "en", past, ()), timedelta(hours=1))
    assert peek(svc, "en:old") is None  # built in the past, expired by now


def test_new_stories_reach_the_hooks_with_every_scope_on_the_build(
        svc: Services, feeds: FeedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[str], list[str]]] = []

    def hook(services: Services, build: CatalogBuild, new: list[Story],
             scope_ids: list[str], now: bool) -> None:
        calls.append((build.key, [s.title for s in new], scope_ids))

    def broken_hook(*args: Any) -> None:
        raise RuntimeError("listener bug")

    # the alerts listener registers itself on import: into the real list, not this test's
    importlib.import_module("sluice.alerts")
    monkeypatch.setattr(catalog_module, "on_new_stories", [broken_hook, hook])
    store = RssStore(svc.db)
    source = store.add_source(feeds.add_rss("/live", items=2))
    store.put_scope("a", "t1", (source.id,), "en", True)
    store.put_scope("b", "t2", (source.id,), "en", True)
    clock = FakeClock()
    tick(svc, clock, ["a", "b"])
    assert calls == []  # a first build announces no backlog
    feeds.add_rss("/live", items=4)
    clock.advance(600)
    tick(svc, clock, ["a", "b"])
    [(key, titles, scopes)] = calls
    assert sorted(titles) == ["live story 2", "live story 3"] and scopes == ["a", "b"]
    assert key == store.scope("a").build_key


def test_two_concurrent_ticks_build_each_set_once(svc: Services, feeds: FeedServer) -> None:
    store = RssStore(svc.db)
    sets = make_sets(store, feeds, sets=3, per_set=3)
    scope_ids = []
    for n in range(9):
        store.put_scope(f"s{n}", f"t{n}", sets[n % 3], "en", True)
        scope_ids.append(f"s{n}")
    clock = FakeClock()
    barrier = threading.Barrier(2)
    results: list[dict[str, int]] = []

    def run(order: list[str]) -> None:
        barrier.wait()
        results.append(tick(svc, clock, order))

    threads = [threading.Thread(target=run, args=(scope_ids,)),
               threading.Thread(target=run, args=(list(reversed(scope_ids)),))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 2
    assert sum(r["builds"] for r in results) == 3
    assert sum(r["locked"] for r in results) == 0  # the loser waited and read the winner's
    assert all(count == 1 for count in feeds.hits.values()) and len(feeds.hits) == 9


def test_the_database_lease_is_exclusive_expires_and_releases_by_token(svc: Services) -> None:
    clock = FakeClock()
    lock = DbLock(RssStore(svc.db), now=clock.now)
    token = lock.acquire("en:k", timedelta(seconds=30))
    assert token is not None and lock.acquire("en:k", timedelta(seconds=30)) is None
    assert not lock.release("en:k", "not-the-token")
    assert lock.acquire("en:k", timedelta(seconds=30)) is None
    clock.advance(31)
    late = lock.acquire("en:k", timedelta(seconds=30))
    assert late is not None and late != token
    assert not lock.release("en:k", token)  # the lapsed holder cannot release the new one
    assert lock.release("en:k", late) and lock.acquire("en:k", timedelta(seconds=1)) is not None


@pytest.mark.redis
def test_the_redis_lock_is_set_nx_px_with_a_token_and_a_safe_release(
        redis_client: Any) -> None:
    lock = RedisLock(redis_client)
    token = lock.acquire("en:k", timedelta(seconds=30))
    assert token is not None and lock.acquire("en:k", timedelta(seconds=30)) is None
    ttl = redis_client.eval("return redis.call('PTTL', KEYS[1])", ["rss:build-lock:en:k"], [])
    assert 0 < int(ttl) <= 30_000
    assert not lock.release("en:k", "not-the-token")
    assert lock.acquire("en:k", timedelta(seconds=30)) is None
    assert lock.release("en:k", token)
    assert lock.acquire("en:k", timedelta(milliseconds=50)) is not None


@pytest.mark.redis
def test_concurrent_ticks_share_builds_through_redis(
        db_url: str, make_services: Callable[..., Services], redis_env: dict[str, str],
        feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url, **redis_env)
    assert svc.settings.redis_configured
    store = RssStore(svc.db)
    sets = make_sets(store, feeds, sets=2, per_set=2)
    for n in range(4):
        store.put_scope(f"s{n}", f"t{n}", sets[n % 2], "en", True)
    clock = FakeClock()
    barrier = threading.Barrier(2)
    results: list[dict[str, int]] = []

    def run() -> None:
        barrier.wait()
        results.append(tick(svc, clock, [f"s{n}" for n in range(4)]))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sum(r["builds"] for r in results) == 2
    assert all(count == 1 for count in feeds.hits.values()) and len(feeds.hits) == 4


def test_a_build_whose_stories_did_not_change_is_renewed_not_reassembled(
        svc: Services, feeds: FeedServer) -> None:
    """Every source answered 304: the same stories, stored again as built now, and no
    story read or rewritten. A source that publishes makes the next build assemble."""
    store = RssStore(svc.db)
    ids = tuple(store.add_source(feeds.add_rss(f"/r{i}", items=3)).id for i in range(2))
    store.put_scope("s", "t", ids, "en", True)
    clock = FakeClock()
    tick(svc, clock, ["s"])
    first = store.build(store.scope("s").build_key)
    assert first is not None and len(first.stories) == 6 and first.source_tokens is not None

    clock.advance(600)
    second = tick(svc, clock, ["s"])
    assert second["builds"] == 1 and second["reused"] == 1 and second["notModified"] == 2
    renewed = store.build(first.key)
    assert renewed is not None and renewed.built_at == clock.now() > first.built_at
    assert renewed.stories == first.stories and renewed.source_tokens == first.source_tokens

    feeds.feeds["/r1"].set(rss_document("r1", 4))  # one story more
    clock.advance(600)
    third = tick(svc, clock, ["s"])
    assert third["builds"] == 1 and third["reused"] == 0
    rebuilt = store.build(first.key)
    assert rebuilt is not None and len(rebuilt.stories) == 7
    assert rebuilt.source_tokens != first.source_tokens


def test_a_source_fetched_for_another_build_makes_this_one_assemble(
        svc: Services, feeds: FeedServer) -> None:
    """Two sets share a source. The first build of a tick fetches its new story; the
    second skips the fetch (once per tick) but its stories changed all the same: it must
    assemble, not renew."""
    store = RssStore(svc.db)
    common = store.add_source(feeds.add_rss("/common", items=2)).id
    a = store.add_source(feeds.add_rss("/a", items=1)).id
    b = store.add_source(feeds.add_rss("/b", items=1)).id
    store.put_scope("sa", "t", (a, common), "en", True)
    store.put_scope("sb", "t", (b, common), "en", True)
    clock = FakeClock()
    tick(svc, clock, ["sa", "sb"])

    feeds.feeds["/common"].set(rss_document("common", 3))
    clock.advance(600)
    counters = tick(svc, clock, ["sa", "sb"])
    assert counters["builds"] == 2 and counters["reused"] == 0
    for scope_id in ("sa", "sb"):
        build = store.build(store.scope(scope_id).build_key)
        assert build is not None and len(build.stories) == 4, scope_id


def test_a_build_from_before_the_tokens_is_assembled_once(svc: Services,
                                                          feeds: FeedServer) -> None:
    """A stored build without tokens (written before they existed) is never renewed."""
    store = RssStore(svc.db)
    source = store.add_source(feeds.add_rss("/old", items=2)).id
    store.put_scope("s", "t", (source,), "en", True)
    clock = FakeClock()
    tick(svc, clock, ["s"])
    key = store.scope("s").build_key
    stored = store.build(key)
    assert stored is not None
    store.save_build(stored._replace(source_tokens=None, stories=()), timedelta(hours=1))
    assert not store.renew_build(stored._replace(source_tokens=None), timedelta(hours=1))
    clock.advance(600)
    assert tick(svc, clock, ["s"])["reused"] == 0
    again = store.build(key)
    assert again is not None and len(again.stories) == 2 and again.source_tokens is not None
