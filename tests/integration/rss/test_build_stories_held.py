"""A build's decoded stories are kept by the process that read or wrote them, under the
build's ``stories_id``, and never served once another writer replaced them (both
backends; a second ``Database`` on the same URL stands for another process)."""

from __future__ import annotations

from contextlib import closing
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sluice.rss import store as store_module
from sluice.rss.store import CatalogBuild, RssStore, Story
from sluice.store.db import Database, open_database

TTL = timedelta(hours=1)
NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def build(key: str, *titles: str, at: datetime = NOW) -> CatalogBuild:
    stories = tuple(Story(id=f"id-{t}", title=t, link=f"https://news.example/{t}",
                          published_at=at, summary=f"<p>{t}</p>", source_id="src-1")
                    for t in titles)
    return CatalogBuild(key, ("src-1",), "en", at, stories, {"src-1": "token-1"})


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the stories decoded from a row."""
    seen: list[str] = []
    original = Story.from_json

    def counting(data: dict[str, Any]) -> Story:
        seen.append(data["id"])
        return original(data)

    monkeypatch.setattr(store_module.Story, "from_json", counting)
    return seen


def test_a_build_this_process_wrote_is_read_without_decoding_its_stories(
        db: Database, decoded: list[str]) -> None:
    store = RssStore(db)
    saved = build("en:a", "one", "two")
    store.save_build(saved, TTL)
    assert store.build("en:a") == saved
    assert store.build("en:a") == saved
    assert decoded == []


def test_another_writers_build_is_read_whole_never_the_held_one(
        db: Database, db_url: str, decoded: list[str]) -> None:
    mine = RssStore(db)
    mine.save_build(build("en:a", "one"), TTL)
    assert [s.title for s in mine.build("en:a").stories] == ["one"]  # type: ignore[union-attr]
    replaced = build("en:a", "two", "three", at=NOW + timedelta(minutes=5))
    with closing(open_database(db_url)) as other:  # another process's view of the database
        RssStore(other).save_build(replaced, TTL)
    assert mine.build("en:a") == replaced
    assert decoded == ["id-two", "id-three"]
    assert mine.build("en:a") == replaced  # and now held: not decoded again
    assert decoded == ["id-two", "id-three"]


def test_a_renewed_build_keeps_its_stories_held_with_the_new_time(
        db: Database, db_url: str, decoded: list[str]) -> None:
    mine = RssStore(db)
    saved = build("en:a", "one")
    mine.save_build(saved, TTL)
    later = saved._replace(built_at=NOW + timedelta(minutes=10))
    with closing(open_database(db_url)) as other:
        assert RssStore(other).renew_build(later, TTL)
    assert mine.build("en:a") == later
    assert decoded == []


def test_a_build_saved_before_the_column_is_read_whole_every_time(
        db: Database, decoded: list[str]) -> None:
    store = RssStore(db)
    saved = build("en:a", "one")
    store.save_build(saved, TTL)
    with db.transaction() as tx:
        tx.execute("UPDATE rss_builds SET stories_id = NULL WHERE key = 'en:a'")
    assert store.build("en:a") == saved
    assert store.build("en:a") == saved
    assert decoded == ["id-one", "id-one"]


def test_expired_and_missing_builds_are_none_whatever_is_held(db: Database) -> None:
    store = RssStore(db)
    store.save_build(build("en:a", "one", at=NOW - timedelta(hours=2)), TTL)
    assert store.build("en:a", now=NOW) is None
    assert store.build("en:missing") is None


def test_only_the_most_recently_used_keys_are_held(db: Database, decoded: list[str]) -> None:
    store = RssStore(db)
    keys = [f"en:{n}" for n in range(store_module._HeldStories.KEYS + 1)]
    for key in keys:
        store.save_build(build(key, key), TTL)
    assert store.build(keys[-1]) is not None and decoded == []
    assert store.build(keys[0]) is not None
    assert decoded == [f"id-{keys[0]}"]  # pushed out by the newer keys: read whole
