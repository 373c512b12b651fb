"""The tick's fan-out: with ``rssQueuePipeline`` on, one ``rss.ingest`` message per due build.

A build is due when at least one completed scope on its key is past its throttle
(``rss_scope_min_interval_s``) and the stored build is older than that too. The tick
publishes one signed message per due key (``sourceId: "build"``, ``buildKey``,
``tickId``) in rotation order, within its budget; consumers build them in parallel
through the same ``Catalog`` as the inline path, so the per-key lock, the throttle
and the conditional requests are shared, and a key published twice (a redelivered
message, two ticks) is built once and read by the other. The alert listener runs
where the build happens (``Catalog._announce``).

Each tick leaves a row in ``rss_fanout_ticks``: what it published, and what the
consumers did with it (built, shared, locked, failed) and how long the messages
waited for a consumer (the lag).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

from sluice.core.errors import NotFound, SluiceError
from sluice.core.observe import logger
from sluice.core.times import iso_z_or_none
from sluice.jobs.registry import Deadline
from sluice.queues.handlers import BUILD_SOURCE_ID
from sluice.queues.runtime import publisher_of
from sluice.rss.catalog import Catalog
from sluice.rss.store import RssStore
from sluice.store.db import Database, Queries, Row, utcnow

if TYPE_CHECKING:
    from sluice.core.services import Services

Q = Queries.parse((Path(__file__).parent / "fanout.sql").read_text())

TICKS_KEPT = timedelta(days=7)


class DueBuild(NamedTuple):
    key: str
    scope_ids: tuple[str, ...]


class FanOut(TypedDict):
    tickId: str
    due: int
    published: int
    publishFailed: int
    skippedTimeBudget: int


def _moment(value: Any) -> datetime:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def due_builds(store: RssStore, db: Database, *, now: datetime,
               min_interval: timedelta) -> list[DueBuild]:
    """Keys with a completed scope past its throttle and no build younger than the throttle,
    each with its completed scopes, in key order."""
    with db.transaction() as tx:
        built = {row["key"]: _moment(row["built_at"]) for row in tx.fetchall(Q.build_times)}
    scopes: dict[str, list[str]] = {}
    due: set[str] = set()
    for scope in store.scopes():
        if not scope.completed:
            continue
        scopes.setdefault(scope.build_key, []).append(scope.scope_id)
        last = scope.last_refreshed_at
        if last is None or now - _moment(last) >= min_interval:
            due.add(scope.build_key)
    return [DueBuild(key, tuple(scopes[key])) for key in sorted(due)
            if key not in built or now - built[key] >= min_interval]


def publish_builds(services: Services, due: list[DueBuild], *, offset: int,
                   budget: Deadline, now: datetime) -> tuple[FanOut, list[str]]:
    """Publish one message per due key from ``offset`` on, until the budget runs out or a
    publish fails (the queue is down: the rest are left, not lost). Returns the counts and
    the scopes of the keys not published, for the caller to build inline."""
    tick_id = str(uuid.uuid4())
    db = services.db
    with db.transaction() as tx:
        tx.execute(Q.tick_start, {"tick_id": tick_id, "now": now, "due": len(due)})
        tx.execute(Q.tick_prune, {"before": now - TICKS_KEPT})
    order = due[offset:] + due[:offset] if due else []
    publisher = publisher_of(services)
    published = failed = skipped = 0
    left: list[str] = []
    for index, build in enumerate(order):
        if budget.expired():
            skipped = len(order) - index
            break
        try:
            sent = publisher.publish("rss.ingest", {"sourceId": BUILD_SOURCE_ID, "feedUrl": "",
                                                    "buildKey": build.key, "tickId": tick_id})
        except SluiceError as exc:
            services.reporter.error("rss-refresh.fan-out", exc, key=build.key)
            sent = None
        if sent is None or not sent.dispatched:
            failed += 1
            for rest in order[index:]:
                left.extend(rest.scope_ids)
            break
        published += 1
    with db.transaction() as tx:
        tx.execute(Q.tick_published, {"tick_id": tick_id, "published": published,
                                      "publish_failed": failed})
    return {"tickId": tick_id, "due": len(due), "published": published,
            "publishFailed": failed, "skippedTimeBudget": skipped}, left


def tick_figures(row: Row) -> dict[str, Any]:
    done = row["built"] + row["shared"] + row["locked"] + row["failed"]
    return {"tickId": row["tick_id"], "startedAt": iso_z_or_none(_moment(row["started_at"])),
            "due": row["due"], "published": row["published"],
            "publishFailed": row["publish_failed"], "built": row["built"],
            "shared": row["shared"], "locked": row["locked"], "failed": row["failed"],
            "pending": max(0, row["published"] - done),
            "lagMaxMs": row["lag_max_ms"],
            "lagAvgMs": round(row["lag_sum_ms"] / done) if done else None,
            "lastDoneAt": iso_z_or_none(_moment(row["last_done_at"]))
            if row["last_done_at"] else None}


def tick_report(db: Database, tick_id: str) -> dict[str, Any] | None:
    with db.transaction() as tx:
        row = tx.fetchone(Q.tick_get, {"tick_id": tick_id})
    return tick_figures(row) if row else None


def recent_ticks(db: Database, limit: int = 5) -> list[dict[str, Any]]:
    """The last ticks that fanned out, newest first (the operations page)."""
    with db.transaction() as tx:
        return [tick_figures(row) for row in tx.fetchall(Q.tick_recent, {"limit": limit})]


def _record(db: Database, tick_id: str | None, outcome: str, lag_ms: int,
            now: datetime) -> None:
    if not tick_id:
        return
    counts = {"built": 0, "shared": 0, "locked": 0, "failed": 0}
    counts["shared" if outcome in ("fresh", "throttled") else outcome] += 1
    with db.transaction() as tx:
        tx.execute(Q.tick_outcome, {"tick_id": tick_id, "lag_ms": lag_ms, "now": now, **counts})


def refresh_build(services: Services, message: dict[str, Any], *,
                  now: Callable[[], datetime] = utcnow,
                  catalog: Catalog | None = None) -> dict[str, Any]:
    """The ``rss.ingest`` consumer's work for one per-build message: bring the key's build
    up to date, mark its completed scopes refreshed, and add the outcome to the tick's row.
    A failure is counted and raised (the consumer retries the message)."""
    key = str(message.get("buildKey") or "")
    tick_id = message.get("tickId")
    started = now()
    published_at = message.get("publishedAt")
    lag_ms = 0
    if isinstance(published_at, str):
        try:
            lag_ms = max(0, int((started - datetime.fromisoformat(published_at))
                                .total_seconds() * 1000))
        except ValueError:
            lag_ms = 0
    store = RssStore(services.db)
    scopes = [scope for scope in store.scopes_for_build(key) if scope.completed]
    if not scopes:  # every scope on the key was removed or edited since the tick
        _record(services.db, tick_id, "shared", lag_ms, now())
        logger.info(f"[rss.ingest] no completed scope uses {key} any more; nothing built")
        return {"key": key, "outcome": "gone"}
    owned = catalog is None
    cat = catalog or Catalog.open(services, now=now)
    try:
        first = scopes[0]
        refreshed = cat.refresh(key, first.source_ids, first.locale, force=True)
        if refreshed.outcome in ("built", "shared", "fresh"):
            store.mark_all_refreshed([scope.scope_id for scope in scopes], started)
    except Exception:
        _record(services.db, tick_id, "failed", lag_ms, now())
        raise
    finally:
        if owned:
            cat.close()
    _record(services.db, tick_id, refreshed.outcome, lag_ms, now())
    return {"key": key, "outcome": refreshed.outcome, "scopes": len(scopes)}


def refresh_build_message(services: Services, message: dict[str, Any]) -> None:
    """The target ``sluice.queues.handlers`` resolves for a per-build message."""
    try:
        refresh_build(services, message)
    except NotFound:
        logger.info(f"[rss.ingest] build {message.get('buildKey')} has no scope any more")


__all__ = ["BUILD_SOURCE_ID", "DueBuild", "FanOut", "due_builds", "publish_builds",
           "recent_ticks", "refresh_build", "refresh_build_message", "tick_report"]
