"""Sources, tenant scopes, stories and catalog builds in the SQL store (both backends).

A *build* is the story list of one source set in one content locale; every scope
with that set and locale shares it through ``build_key``. Queries are in
``shared/sluice/rss/rss.sql``.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

from sluice.core.errors import Conflict, ConstraintViolation, NotFound
from sluice.core.validate import check_scope_id
from sluice.store.db import Database, Queries, Row, Tx, utcnow

Q = Queries.parse((Path(__file__).parent / "rss.sql").read_text())

GLOBAL_KEY = "global"
GLOBAL_LOCALE = "*"


class Story(NamedTuple):
    id: str
    title: str
    link: str | None
    published_at: datetime | None
    summary: str
    source_id: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "link": self.link,
                "publishedAt": _iso(self.published_at), "summary": self.summary,
                "sourceId": self.source_id}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Story:
        published = data.get("publishedAt")
        return cls(id=data["id"], title=data["title"], link=data.get("link"),
                   published_at=datetime.fromisoformat(published) if published else None,
                   summary=data.get("summary", ""), source_id=data["sourceId"])


class CatalogBuild(NamedTuple):
    key: str
    source_ids: tuple[str, ...]
    locale: str
    built_at: datetime
    stories: tuple[Story, ...]
    # Each source's stories token when the stories were assembled (``RssStore.story_tokens``);
    # None: unknown (an older build), never reused.
    source_tokens: dict[str, str | None] | None = None

    def to_json(self, limit: int | None = None) -> dict[str, Any]:
        return {"key": self.key, "sourceIds": list(self.source_ids), "locale": self.locale,
                "builtAt": _iso(self.built_at),
                "stories": [s.to_json() for s in self.stories[:limit]]}


class Source(NamedTuple):
    id: str
    url: str
    title: str | None
    is_global: bool
    etag: str | None
    last_modified: str | None
    last_fetched_at: datetime | None
    last_success_at: datetime | None
    last_status: int | None
    last_error: str | None
    consecutive_failures: int
    next_attempt_at: datetime | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: Row) -> Source:
        return cls(**{**{k: row[k] for k in cls._fields}, "is_global": bool(row["is_global"])})

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "url": self.url, "title": self.title, "global": self.is_global,
                "fetchState": {
                    "etag": self.etag, "lastModified": self.last_modified,
                    "lastFetchedAt": _iso(self.last_fetched_at),
                    "lastSuccessAt": _iso(self.last_success_at),
                    "lastStatus": self.last_status, "lastError": self.last_error,
                    "consecutiveFailures": self.consecutive_failures,
                    "nextAttemptAt": _iso(self.next_attempt_at)},
                "createdAt": _iso(self.created_at)}


class Scope(NamedTuple):
    scope_id: str
    tenant_id: str
    source_ids: tuple[str, ...]
    locale: str
    build_key: str
    completed: bool
    last_refreshed_at: datetime | None

    @classmethod
    def from_row(cls, row: Row) -> Scope:
        return cls(scope_id=row["scope_id"], tenant_id=row["tenant_id"],
                   source_ids=tuple(row["source_ids"]), locale=row["locale"],
                   build_key=row["build_key"], completed=bool(row["completed"]),
                   last_refreshed_at=row["last_refreshed_at"])

    def to_json(self) -> dict[str, Any]:
        return {"scopeId": self.scope_id, "tenantId": self.tenant_id,
                "sourceIds": list(self.source_ids), "locale": self.locale,
                "completed": self.completed, "buildKey": self.build_key,
                "lastRefreshedAt": _iso(self.last_refreshed_at)}


class FetchState(NamedTuple):
    """What one fetch leaves on its source: success (with validators) or a failure."""

    ok: bool
    status: int | None
    etag: str | None = None
    last_modified: str | None = None
    error: str | None = None
    next_attempt_at: datetime | None = None


class _HeldStories:
    """The decoded stories of the last builds this process read or wrote, per key, under
    their ``stories_id``; the least recently used key goes first. A read sends the id it
    holds, and the row comes back without its stories while they are still the same
    (``build_get``), so nothing stale is ever served: another process's save changes the
    id, and the stories are read again."""

    # 16 builds of at most 500 stories (summaries up to 2,000 characters): about 20 MB in
    # the worst case, a few MB for usual summaries
    KEYS = 16

    def __init__(self) -> None:
        self._stories: OrderedDict[str, tuple[str, tuple[Story, ...]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[str, tuple[Story, ...]] | None:
        with self._lock:
            found = self._stories.get(key)
            if found is not None:
                self._stories.move_to_end(key)
            return found

    def put(self, key: str, stories_id: str, stories: tuple[Story, ...]) -> None:
        with self._lock:
            self._stories[key] = (stories_id, stories)
            self._stories.move_to_end(key)
            while len(self._stories) > self.KEYS:
                self._stories.popitem(last=False)


# one per database object: a process may open several (tests, the simulation's seeds)
_HELD: weakref.WeakKeyDictionary[Database, _HeldStories] = weakref.WeakKeyDictionary()
_HELD_LOCK = threading.Lock()


def _held(db: Database) -> _HeldStories:
    with _HELD_LOCK:
        held = _HELD.get(db)
        if held is None:
            held = _HELD[db] = _HeldStories()
        return held


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat() if moment is not None else None


def build_key(source_ids: Iterable[str], locale: str) -> str:
    """The key every scope with this source set and locale shares (order-insensitive)."""
    ids = ",".join(sorted(set(source_ids)))
    return f"{locale}:{hashlib.sha256(ids.encode()).hexdigest()[:24]}"


class RssStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # --- sources ---------------------------------------------------------------

    def add_source(self, url: str, title: str | None = None, is_global: bool = False) -> Source:
        source_id = f"src_{uuid.uuid4().hex[:16]}"
        try:
            with self.db.transaction() as tx:
                tx.execute(Q.source_insert, {"id": source_id, "url": url, "title": title,
                                             "is_global": is_global, "now": utcnow()})
        except ConstraintViolation:
            raise Conflict(f"a source with this url already exists: {url}", field="url") from None
        return self.source(source_id)

    def source(self, source_id: str) -> Source:
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.source_get, {"id": source_id})
        if row is None:
            raise NotFound(f"no source {source_id!r}", field="sourceId")
        return Source.from_row(row)

    def sources(self) -> list[Source]:
        with self.db.transaction() as tx:
            return [Source.from_row(r) for r in tx.fetchall(Q.source_list)]

    def sources_by_ids(self, ids: Iterable[str]) -> list[Source]:
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.sources_by_ids, {"ids": tx.json(sorted(set(ids)))})
        return [Source.from_row(r) for r in rows]

    def global_source_ids(self) -> tuple[str, ...]:
        with self.db.transaction() as tx:
            return tuple(r["id"] for r in tx.fetchall(Q.source_global_ids))

    def remove_source(self, source_id: str) -> None:
        """Delete a source and its stories; refused (409) while a scope uses it."""
        with self.db.transaction() as tx:
            users = [r["scope_id"] for r in tx.fetchall(Q.scopes_using_source,
                                                         {"source_id": source_id})]
            if users:
                raise Conflict(f"source {source_id} is used by scopes: {', '.join(users)}",
                               scopes=users)
            if tx.execute(Q.source_delete, {"id": source_id}) == 0:
                raise NotFound(f"no source {source_id!r}", field="sourceId")

    def record_fetch(self, source_id: str, state: FetchState, now: datetime, *,
                     stories: list[Story] | None = None, keep: int = 0) -> None:
        """The fetch's outcome, and (``stories``) what it read, in one transaction."""
        with self.db.transaction() as tx:
            if stories:
                self._save_stories(tx, source_id, stories, now, keep)
            if state.ok:
                # a success may carry a note: the document was read only in part
                tx.execute(Q.source_fetched, {"id": source_id, "etag": state.etag,
                                              "last_modified": state.last_modified,
                                              "status": state.status, "now": now,
                                              "error": (state.error or "")[:500] or None})
            else:
                tx.execute(Q.source_failed, {"id": source_id, "status": state.status,
                                             "error": (state.error or "")[:500], "now": now,
                                             "next_attempt_at": state.next_attempt_at})

    # --- stories ---------------------------------------------------------------

    def save_stories(self, source_id: str, stories: list[Story], now: datetime,
                     keep: int) -> None:
        if not stories:
            return
        with self.db.transaction() as tx:
            self._save_stories(tx, source_id, stories, now, keep)

    @staticmethod
    def _save_stories(tx: Tx, source_id: str, stories: list[Story], now: datetime,
                      keep: int) -> None:
        tx.executemany(Q.story_upsert, [
            {"source_id": source_id, "id": s.id, "title": s.title, "link": s.link,
             "published_at": s.published_at, "summary": s.summary, "now": now}
            for s in stories])
        tx.execute(Q.stories_prune, {"source_id": source_id, "keep": keep})
        # a new token whenever the stories were written: a build assembled from the old
        # ones is not reused (a random token, so a deleted and re-added source never
        # repeats one)
        tx.execute(Q.source_stories_changed, {"id": source_id, "token": uuid.uuid4().hex})

    def story_tokens(self, source_ids: Iterable[str]) -> dict[str, str | None]:
        """Each stored source's stories token (a source that is gone is absent)."""
        with self.db.transaction() as tx:
            return {r["id"]: r["stories_token"] for r in tx.fetchall(
                Q.story_tokens, {"ids": tx.json(sorted(set(source_ids)))})}

    def stories_of(self, source_ids: Iterable[str]) -> list[Row]:
        with self.db.transaction() as tx:
            return tx.fetchall(Q.stories_of_sources, {"ids": tx.json(sorted(set(source_ids)))})

    # --- scopes ----------------------------------------------------------------

    def put_scope(self, scope_id: str, tenant_id: str, source_ids: tuple[str, ...],
                  locale: str, completed: bool) -> Scope:
        key = build_key(source_ids, locale)
        with self.db.transaction() as tx:
            tx.execute(Q.scope_upsert, {"scope_id": scope_id, "tenant_id": tenant_id,
                                        "source_ids": tx.json(list(source_ids)),
                                        "locale": locale, "build_key": key,
                                        "completed": completed, "now": utcnow()})
        return self.scope(scope_id)

    def has_scope(self, scope_id: str) -> bool:
        with self.db.transaction() as tx:
            return tx.fetchone(Q.scope_get, {"scope_id": scope_id}) is not None

    def scope(self, scope_id: str) -> Scope:
        check_scope_id(scope_id)  # a name no scope can have is a 400, not a 404
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.scope_get, {"scope_id": scope_id})
        if row is None:
            raise NotFound(f"no scope {scope_id!r}", field="scopeId")
        return Scope.from_row(row)

    def scopes(self) -> list[Scope]:
        with self.db.transaction() as tx:
            return [Scope.from_row(r) for r in tx.fetchall(Q.scope_list)]

    def completed_scope_ids(self) -> list[str]:
        with self.db.transaction() as tx:
            return [r["scope_id"] for r in tx.fetchall(Q.scope_completed_ids)]

    def scope_ids_for_build(self, key: str) -> list[str]:
        with self.db.transaction() as tx:
            return [r["scope_id"] for r in tx.fetchall(Q.scope_ids_for_build,
                                                        {"build_key": key})]

    def remove_scope(self, scope_id: str) -> None:
        check_scope_id(scope_id)
        with self.db.transaction() as tx:
            if tx.execute(Q.scope_delete, {"scope_id": scope_id}) == 0:
                raise NotFound(f"no scope {scope_id!r}", field="scopeId")

    def scopes_for_build(self, key: str) -> list[Scope]:
        with self.db.transaction() as tx:
            return [Scope.from_row(r) for r in tx.fetchall(Q.scopes_for_build,
                                                           {"build_key": key})]

    def mark_refreshed(self, scope_id: str, now: datetime) -> None:
        self.mark_all_refreshed([scope_id], now)

    def mark_all_refreshed(self, scope_ids: list[str], now: datetime) -> None:
        with self.db.transaction() as tx:
            tx.executemany(Q.scope_refreshed, [{"scope_id": scope_id, "now": now}
                                               for scope_id in scope_ids])

    # --- builds ----------------------------------------------------------------

    def build(self, key: str, now: datetime | None = None) -> CatalogBuild | None:
        """The stored build of ``key`` unless it expired (``now`` given) or never existed.

        Its stories are read and decoded only when this process does not hold them already
        (``_HeldStories``): a build's up to 500 stories are what the tick, the sweep and
        every catalog read would otherwise decode again each time."""
        held = _held(self.db)
        known = held.get(key)
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.build_get, {"key": key,
                                            "known": known[0] if known else None})
        if row is None or (now is not None and row["expires_at"] <= now):
            return None
        stories_id = row["stories_id"]
        if known is not None and stories_id == known[0]:
            stories = known[1]
        else:
            raw = row["stories"]
            # SQLite returns the CASE expression as text (no declared type to convert by)
            decoded = json.loads(raw) if isinstance(raw, str | bytes) else raw
            stories = tuple(Story.from_json(s) for s in decoded)
            if stories_id is not None:
                held.put(key, stories_id, stories)
        return CatalogBuild(key=row["key"], source_ids=tuple(row["source_ids"]),
                            locale=row["locale"], built_at=row["built_at"],
                            stories=stories, source_tokens=row["source_tokens"])

    def built_at(self, key: str) -> datetime | None:
        """When the stored build of ``key`` was made (None: never), without reading its
        stories: what a freshness check needs."""
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.build_time, {"key": key})
        return row["built_at"] if row is not None else None

    def save_build(self, build: CatalogBuild, ttl: timedelta) -> None:
        tokens = build.source_tokens
        # not uuid4: the simulation draws those from its seed, and this id must never
        # repeat across databases or runs (it names the stories in every process's memory)
        stories_id = secrets.token_hex(16)
        with self.db.transaction() as tx:
            tx.execute(Q.build_save, {
                "key": build.key, "source_ids": tx.json(list(build.source_ids)),
                "locale": build.locale, "built_at": build.built_at,
                "expires_at": build.built_at + ttl,
                "stories": tx.json([s.to_json() for s in build.stories]),
                "source_tokens": tx.json(tokens) if tokens is not None else None,
                "stories_id": stories_id})
        _held(self.db).put(build.key, stories_id, build.stories)  # committed: now they are

    def renew_build(self, build: CatalogBuild, ttl: timedelta) -> bool:
        """Store ``build`` again with its new ``built_at`` without rewriting its stories:
        only while the stored row still holds the same source set, locale and tokens
        (False, nothing written, otherwise: save it whole)."""
        if build.source_tokens is None:
            return False
        with self.db.transaction() as tx:
            return tx.execute(Q.build_renew, {
                "key": build.key, "source_ids": tx.json(list(build.source_ids)),
                "locale": build.locale, "built_at": build.built_at,
                "expires_at": build.built_at + ttl,
                "source_tokens": tx.json(build.source_tokens)}, final=True) == 1

    # --- the database lease (used when Redis is not configured) ---------------

    def acquire_lock(self, key: str, token: str, ttl: timedelta, now: datetime) -> bool:
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.lock_acquire, {"key": key, "token": token, "now": now,
                                               "expires_at": now + ttl})
        return row is not None and row["token"] == token

    def release_lock(self, key: str, token: str) -> bool:
        with self.db.transaction() as tx:
            return tx.execute(Q.lock_release, {"key": key, "token": token}) == 1
