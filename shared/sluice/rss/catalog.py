"""Catalog builds: the stories of one (source set, locale), built once and shared.

Every scope with the same source set and locale shares one build (its
``build_key``), so N tenants on the default catalog cost one build, not N. Three
things stop rebuilds:

* a build made less than ``rss_scope_min_interval_s`` ago is reused, and a scope is
  not refreshed more often than that either (the per-scope throttle);
* within one tick a key is built at most once, and a source shared by two sets is
  fetched at most once (``TickMemo``);
* a cross-instance lock per key (Redis ``SET NX PX`` with a token when Redis is
  configured, a database lease otherwise): the loser waits briefly for the winner's
  build and reads it, or skips.

``peek`` and ``peek_scope`` read what is stored and never fetch.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, Self

from sluice.core.errors import NotFound, PermanentStoreError
from sluice.core.observe import logger
from sluice.rss.bounds import EntryBudget
from sluice.rss.fetch import Fetched, Fetcher, settings_fetcher
from sluice.rss.store import (
    GLOBAL_KEY,
    GLOBAL_LOCALE,
    CatalogBuild,
    RssStore,
    Source,
    Story,
    build_key,
)
from sluice.rss.sweep import resolve_alert_sweep
from sluice.store.db import utcnow

if TYPE_CHECKING:
    from sluice.core.services import Services

MAX_BUILD_STORIES = 500
STORIES_KEPT_PER_SOURCE = 200
LOCK_POLL_S = 0.1
# How long past its deadline a build waits for its fetches to end: requests end at the
# deadline, and no parse starts after it, so this covers one bounded parse per slot.
FETCH_GRACE_S = 5.0

Outcome = Literal["built", "shared", "fresh", "throttled", "locked"]
NewStoriesHook = Callable[["Services", CatalogBuild, list[Story], list[str], bool], int | None]
# Called after a build brings stories its previous build did not have (not on a
# key's first build, which would announce a whole backlog). The last argument asks the
# listener to do its work now (inside a tick, which counts it) rather than after the
# response; it then returns how many alerts it enqueued.
on_new_stories: list[NewStoriesHook] = []


class Lock(Protocol):
    def acquire(self, key: str, ttl: timedelta) -> str | None:
        """A token when the lock was taken, else None."""
        ...

    def release(self, key: str, token: str) -> bool: ...


class RedisLock:
    """``SET key token NX PX ttl``; released only by the holder of the token."""

    ACQUIRE = "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])"
    RELEASE = ("if redis.call('GET', KEYS[1]) == ARGV[1] then "
               "return redis.call('DEL', KEYS[1]) else return 0 end")

    def __init__(self, redis: Any) -> None:
        self.redis = redis

    def acquire(self, key: str, ttl: timedelta) -> str | None:
        token = uuid.uuid4().hex
        got = self.redis.eval(self.ACQUIRE, [f"rss:build-lock:{key}"],
                              [token, int(ttl.total_seconds() * 1000)])
        return token if got else None

    def release(self, key: str, token: str) -> bool:
        return bool(self.redis.eval(self.RELEASE, [f"rss:build-lock:{key}"], [token]))


class DbLock:
    """A lease row per key that lapses at its expiry (no Redis configured)."""

    def __init__(self, store: RssStore, now: Callable[[], datetime] = utcnow) -> None:
        self.store = store
        self.now = now

    def acquire(self, key: str, ttl: timedelta) -> str | None:
        token = uuid.uuid4().hex
        return token if self.store.acquire_lock(key, token, ttl, self.now()) else None

    def release(self, key: str, token: str) -> bool:
        return self.store.release_lock(key, token)


def lock_for(services: Services, store: RssStore) -> Lock:
    return RedisLock(services.redis) if services.settings.redis_configured else DbLock(store)


class TickMemo:
    """What one tick already did: keys built or read, sources fetched."""

    def __init__(self) -> None:
        self.builds: dict[str, CatalogBuild | None] = {}
        self.sources: set[str] = set()
        self.lock = threading.Lock()


class Counters:
    """Work done, for the tick's result and the benchmark."""

    def __init__(self) -> None:
        self.builds = self.shared = self.throttled = self.locked = 0
        self.reused = 0  # builds stored again as they were: no story of theirs changed
        self.fetches = self.not_modified = self.fetch_failures = self.backing_off = 0
        self.bytes_parsed = 0
        self.feeds_cut = 0  # feeds read only in part (the entry caps)
        self.skipped = 0  # due sources not fetched: the build's deadline or entry budget
        self.new_story_alerts = self.new_story_failures = 0

    def to_json(self) -> dict[str, int]:
        return {"builds": self.builds, "reused": self.reused, "shared": self.shared,
                "throttled": self.throttled, "locked": self.locked, "fetches": self.fetches,
                "notModified": self.not_modified, "fetchFailures": self.fetch_failures,
                "backingOff": self.backing_off, "bytesParsed": self.bytes_parsed,
                "feedsCut": self.feeds_cut, "skipped": self.skipped,
                "newStoryAlerts": self.new_story_alerts}


class Refreshed(NamedTuple):
    outcome: Outcome
    build: CatalogBuild | None


class Catalog:
    def __init__(self, services: Services, fetcher: Fetcher, *,
                 now: Callable[[], datetime] = utcnow,
                 lock: Lock | None = None, memo: TickMemo | None = None,
                 stop_at: float | None = None) -> None:
        settings = services.settings
        self.services = services
        self.store = RssStore(services.db)
        self.fetcher = fetcher
        self.now = now
        self.lock = lock or lock_for(services, self.store)
        self.memo = memo or TickMemo()
        self.counters = Counters()
        self.announce_now = False  # a tick sets it: new-story listeners run inline, counted
        self.ttl = timedelta(seconds=settings.rss_build_ttl_s)
        self.min_interval = timedelta(seconds=settings.rss_scope_min_interval_s)
        self.build_deadline_s = settings.rss_build_deadline_s
        self.lock_wait_s = settings.rss_lock_wait_s
        self.concurrency = settings.rss_fetch_concurrency
        self.max_build_entries = settings.rss_max_build_entries
        # the run's own deadline (the fetcher's monotonic clock): no build outlives it
        self.stop_at = stop_at

    @classmethod
    def open(cls, services: Services, **kwargs: Any) -> Catalog:
        """A catalog with its own HTTP client (``close()`` it)."""
        return cls(services, settings_fetcher(services.settings), **kwargs)

    def close(self) -> None:
        self.fetcher.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- entry points -----------------------------------------------------------

    def refresh_scope(self, scope_id: str, *, force: bool = True) -> Refreshed:
        """Bring one scope's build up to date (shared with every scope on its key)."""
        scope = self.store.scope(scope_id)
        now = self.now()
        if scope.last_refreshed_at and now - scope.last_refreshed_at < self.min_interval:
            self.counters.throttled += 1
            return Refreshed("throttled", self.store.build(scope.build_key))
        refreshed = self.refresh(scope.build_key, scope.source_ids, scope.locale, force=force)
        if refreshed.outcome in ("built", "shared", "fresh"):
            self.store.mark_refreshed(scope_id, now)
        return refreshed

    def refresh_global(self, *, force: bool = True, rebuild: bool = False,
                       since: datetime | None = None) -> Refreshed:
        """``rebuild``: build even inside the throttle (only a build made from ``since`` on,
        default now, by this call or by the lock's holder, serves it)."""
        if rebuild and since is None:
            since = self.now()
        return self.refresh(GLOBAL_KEY, self.store.global_source_ids(), GLOBAL_LOCALE,
                            force=force, since=since if rebuild else None)

    def refresh(self, key: str, source_ids: tuple[str, ...], locale: str, *,
                force: bool, since: datetime | None = None) -> Refreshed:
        with self.memo.lock:
            seen = key in self.memo.builds
            known = self.memo.builds.get(key)
        if seen and (since is None or (known is not None and known.built_at >= since)):
            self.counters.shared += 1
            return Refreshed("shared", known)
        built_at = self.store.built_at(key)  # the stories are read only when needed
        if built_at is not None and self._recent_at(built_at, force, since):
            stored = self.store.build(key)
            if stored is not None and self._recent(stored, force, since):
                self._remember(key, stored)
                self.counters.shared += 1
                return Refreshed("fresh", stored)
        token = self.lock.acquire(key, timedelta(seconds=self.build_deadline_s + 30))
        if token is None:
            return self._wait_for_winner(key, force, since)
        try:
            stored = self.store.build(key)  # the previous holder may have just built it
            if stored is not None and self._recent(stored, force, since):
                self._remember(key, stored)
                self.counters.shared += 1
                return Refreshed("fresh", stored)
            build = self._build(key, source_ids, locale, stored)
        finally:
            if not self.lock.release(key, token):
                logger.warning(f"[rss] build lock of {key} lapsed before release")
        self._remember(key, build)
        return Refreshed("built", build)

    # --- internals -------------------------------------------------------------

    def _recent(self, build: CatalogBuild, force: bool, since: datetime | None = None) -> bool:
        return self._recent_at(build.built_at, force, since)

    def _recent_at(self, built_at: datetime, force: bool, since: datetime | None) -> bool:
        if since is not None:
            return built_at >= since
        age = self.now() - built_at
        return age < self.min_interval or (not force and age < self.ttl)

    def current_builds(self) -> dict[str, CatalogBuild]:
        """The builds this catalog made or found fresh, by key (a copy)."""
        with self.memo.lock:
            return {key: build for key, build in self.memo.builds.items() if build is not None}

    def _remember(self, key: str, build: CatalogBuild | None) -> None:
        with self.memo.lock:
            self.memo.builds[key] = build

    def _wait_for_winner(self, key: str, force: bool,
                         since: datetime | None = None) -> Refreshed:
        started = time.monotonic()  # real time: the winner builds in real time
        while time.monotonic() - started < self.lock_wait_s:
            time.sleep(LOCK_POLL_S)
            stored = self.store.build(key)
            if stored is not None and self._recent(stored, force, since):
                self._remember(key, stored)
                self.counters.shared += 1
                return Refreshed("shared", stored)
        self.counters.locked += 1
        logger.info(f"[rss] {key} is being built elsewhere; skipped")
        return Refreshed("locked", self.store.build(key))

    def _build(self, key: str, source_ids: tuple[str, ...], locale: str,
               previous: CatalogBuild | None) -> CatalogBuild:
        now = self.now()
        sources = self.store.sources_by_ids(source_ids)
        due = []
        with self.memo.lock:
            for source in sources:
                if source.id in self.memo.sources:
                    continue
                if source.next_attempt_at and source.next_attempt_at > now:
                    self.counters.backing_off += 1
                    continue
                self.memo.sources.add(source.id)
                due.append(source)
        # the longest unfetched first: a source skipped at the deadline or the entry budget
        # leads the next build
        due.sort(key=lambda s: (s.last_fetched_at is not None, s.last_fetched_at or now))
        deadline_at = self.fetcher.monotonic() + self.build_deadline_s
        if self.stop_at is not None:
            deadline_at = min(deadline_at, self.stop_at)
        if due:
            self._fetch_all(due, now, deadline_at)
        # the tokens are read before the stories: a write in between changes a token, and
        # the next build assembles again
        tokens = self.store.story_tokens(source_ids)
        build = self._renewed(previous, source_ids, locale, tokens, now)
        if build is None:
            build = CatalogBuild(key=key, source_ids=tuple(sorted(set(source_ids))),
                                 locale=locale, built_at=now,
                                 stories=self._assemble(source_ids), source_tokens=tokens)
            self.store.save_build(build, self.ttl)
        self.counters.builds += 1
        if previous is not None:
            known = {s.id for s in previous.stories}
            new = [s for s in build.stories if s.id not in known]
            if new:
                self._announce(build, new)
        return build

    def _renewed(self, previous: CatalogBuild | None, source_ids: tuple[str, ...],
                 locale: str, tokens: dict[str, str | None],
                 now: datetime) -> CatalogBuild | None:
        """``previous`` stored again as built ``now`` when no story of its sources was
        written since it was assembled (every source answered 304, failed, was backing off
        or fetched by another build that found nothing new): the same stories, without
        reading and rewriting them. None: assemble."""
        if (previous is None or previous.source_tokens != tokens or previous.locale != locale
                or previous.source_ids != tuple(sorted(set(source_ids)))):
            return None
        build = previous._replace(built_at=now)
        if not self.store.renew_build(build, self.ttl):
            return None
        self.counters.reused += 1
        return build

    def _fetch_all(self, due: list[Source], now: datetime, deadline_at: float) -> None:
        """Each due source fetched on the pool and recorded as it ends (so a build holds the
        stories of its fetches under way, not of all its sources). Fetches end by the
        deadline and no parse starts after it; the build waits for them up to a grace past
        it, and a worker still busy then is recorded as failed, with backoff."""
        workers = max(1, min(self.concurrency, len(due)))
        budget = EntryBudget(self.max_build_entries)
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rss-fetch")
        try:
            pending: dict[Future[Fetched], Source] = {
                pool.submit(self.fetcher.fetch, source, now, deadline_at, budget): source
                for source in due}
            while pending:
                left = deadline_at + FETCH_GRACE_S - self.fetcher.monotonic()
                done, _ = wait(pending, timeout=max(0.0, left), return_when=FIRST_COMPLETED)
                if not done:
                    break
                for future in done:
                    source = pending.pop(future)
                    self._record_one(source, self._outcome(source, future, now), now)
        finally:
            # every fetch ended: the idle workers are joined, so none outlives the build
            pool.shutdown(wait=not pending, cancel_futures=True)
        for future, source in pending.items():
            if not future.cancelled():
                self._record_one(source, self.fetcher.abandoned(
                    source, now, "timed out: still running at the build deadline"), now)

    def _outcome(self, source: Source, future: Future[Fetched], now: datetime) -> Fetched:
        if (error := future.exception()) is not None:
            # one source's unexpected error is that source's failure, not the build's
            return self.fetcher.abandoned(
                source, now,
                f"fetch failed: {type(error).__name__}: {str(error)[:300]}")
        return future.result()

    def _record_one(self, source: Source, fetched: Fetched, now: datetime) -> None:
        try:
            self._record(source, fetched, now)
        except PermanentStoreError as exc:  # its stories cannot be stored: its failure
            self._record(source, self.fetcher.abandoned(
                source, now, f"not stored: {exc.message}"), now)

    def _record(self, source: Source, fetched: Fetched, now: datetime) -> None:
        if fetched.skipped:
            self.counters.skipped += 1
            return
        self.counters.fetches += 1
        if fetched.state.ok and fetched.state.error:
            self.counters.feeds_cut += 1
            logger.warning(f"[rss] {source.id} ({source.url}): {fetched.state.error}")
        self.counters.bytes_parsed += fetched.bytes
        if fetched.not_modified:
            self.counters.not_modified += 1
        if not fetched.state.ok:
            self.counters.fetch_failures += 1
            logger.warning(f"[rss] fetch failed for {source.id} ({source.url}): "
                           f"{fetched.state.error}")
        self.store.record_fetch(source.id, fetched.state, now, stories=fetched.stories,
                                keep=STORIES_KEPT_PER_SOURCE)

    def _assemble(self, source_ids: tuple[str, ...]) -> tuple[Story, ...]:
        """The newest stories of the set, one per id (the same article from two sources
        is one story)."""
        rows = self.store.stories_of(source_ids)
        rows.sort(key=lambda r: (r["published_at"] or r["first_seen_at"], r["first_seen_at"],
                                 r["id"]), reverse=True)
        seen: set[str] = set()
        stories = []
        for row in rows:
            if row["id"] in seen:
                continue
            seen.add(row["id"])
            stories.append(Story(id=row["id"], title=row["title"], link=row["link"],
                                 published_at=row["published_at"], summary=row["summary"],
                                 source_id=row["source_id"]))
            if len(stories) >= MAX_BUILD_STORIES:
                break
        return tuple(stories)

    def _announce(self, build: CatalogBuild, new: list[Story]) -> None:
        scope_ids = self.store.scope_ids_for_build(build.key)
        try:
            # registers the alerts listener in this process; None: the alerts pack is off,
            # and no listener runs, whatever this process imported
            if resolve_alert_sweep() is None:
                return
        except ImportError as exc:
            self.services.reporter.error("rss.on_new_stories", exc, key=build.key)
        for hook in on_new_stories:
            try:
                enqueued = hook(self.services, build, new, scope_ids, self.announce_now)
            except Exception as exc:  # noqa: BLE001 - a listener never fails the build
                self.counters.new_story_failures += 1
                self.services.reporter.error("rss.on_new_stories", exc, key=build.key)
            else:
                self.counters.new_story_alerts += enqueued or 0


def peek(services: Services, key: str) -> CatalogBuild | None:
    """The stored, unexpired build of ``key``; never fetches."""
    return RssStore(services.db).build(key, now=utcnow())


def peek_scope(services: Services, scope_id: str, *,
               builds: dict[str, CatalogBuild | None] | None = None,
               lock: threading.Lock | None = None) -> CatalogBuild | None:
    """The stored, unexpired build behind ``scope_id`` (None for an unknown scope or no
    build yet); never fetches. With ``builds`` (and ``lock`` when shared by threads),
    each build key is read once across calls."""
    store = RssStore(services.db)
    try:
        scope = store.scope(scope_id)
    except NotFound:
        return None
    if builds is None:
        return store.build(scope.build_key, now=utcnow())
    with lock or threading.Lock():
        if scope.build_key not in builds:
            builds[scope.build_key] = store.build(scope.build_key, now=utcnow())
        return builds[scope.build_key]


REBUILD_FIELD = "rebuild"


def rebuild_since(message: dict[str, Any]) -> datetime | None:
    """When an ``rss.ingest`` message asks for the admin refresh's rebuild inside the
    throttle (``rebuild: true``, set by the tick on the admin ``POST``): the moment from
    which a build serves it, its ``publishedAt`` (a build made since then, by another
    delivery of the same message included, is not made again). None: the throttle holds."""
    if message.get(REBUILD_FIELD) is not True:
        return None
    published = message.get("publishedAt")
    try:
        since = datetime.fromisoformat(str(published))
    except ValueError:
        return utcnow()
    return since if since.tzinfo is not None else since.replace(tzinfo=UTC)


def refresh_global_catalog(services: Services, message: dict[str, Any]) -> dict[str, Any]:
    """The ``rss.ingest`` handler: the tick's inline refresh of the global catalog, forced,
    and rebuilt inside the throttle when the message says so (``rebuild_since``)."""
    since = rebuild_since(message)
    with Catalog.open(services) as catalog:
        refreshed = catalog.refresh_global(force=True, rebuild=since is not None, since=since)
        return {"outcome": refreshed.outcome,
                "stories": len(refreshed.build.stories) if refreshed.build else 0,
                **catalog.counters.to_json()}


__all__ = ["REBUILD_FIELD", "Catalog", "CatalogBuild", "Story", "build_key", "on_new_stories",
           "peek", "peek_scope", "rebuild_since", "refresh_global_catalog"]
