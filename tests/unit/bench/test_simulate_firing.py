"""The simulator's scheduling arithmetic, without running Sluice: firings on their
schedule's grid, a feed's next change, and when a delayed effect is owed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from bench.simulate.billing import owed_at
from bench.simulate.firing import Firing
from bench.simulate.peers import Feed, FeedStory, Window
from sluice.jobs.schedule import parse

T0 = datetime(2026, 1, 5, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def test_a_rate_fires_on_its_grid_from_the_start_whatever_a_run_waited() -> None:
    firing = Firing("delivery-drain", parse("rate(1 minute)"), T0)
    assert firing.ceil(T0) == T0 + MINUTE  # never the start itself
    assert firing.ceil(T0 + MINUTE) == T0 + MINUTE
    assert firing.ceil(T0 + MINUTE + timedelta(seconds=20)) == T0 + 2 * MINUTE
    assert firing.after(T0 + MINUTE) == T0 + 2 * MINUTE
    assert firing.grid_count(T0 + timedelta(days=1)) == 1440


def test_a_cron_fires_at_its_times() -> None:
    firing = Firing("state-cleanup", parse("cron(15 3 * * ? *)"), T0)
    assert not firing.gated
    assert firing.ceil(T0) == T0.replace(hour=3, minute=15)
    assert firing.after(T0.replace(hour=3, minute=15)) == T0.replace(day=6, hour=3, minute=15)


def test_a_feed_changes_when_a_story_is_published_or_a_window_begins_or_ends() -> None:
    feed = Feed("feed-0", [Window(T0 + 5 * MINUTE, T0 + 9 * MINUTE, "down")])
    feed.stories = [FeedStory(1, T0 + 2 * MINUTE, ("kw00",)),
                    FeedStory(2, T0 + 7 * MINUTE, ("kw01",))]
    assert feed.next_change(T0) == T0 + 2 * MINUTE
    assert feed.next_change(T0 + 2 * MINUTE) == T0 + 5 * MINUTE  # fetched at the story: seen
    assert feed.next_change(T0 + 5 * MINUTE) == T0 + 7 * MINUTE
    assert feed.next_change(T0 + 8 * MINUTE) == T0 + 9 * MINUTE
    assert feed.next_change(T0 + 9 * MINUTE) is None


def test_an_effect_is_owed_after_the_first_stretch_clear_of_every_window() -> None:
    hour = timedelta(hours=1)
    assert owed_at(T0, [], T0 + 10 * hour) == T0 + hour
    windows = [Window(T0 + 30 * MINUTE, T0 + 2 * hour, "error"),
               Window(T0 + 2 * hour + 10 * MINUTE, T0 + 3 * hour, "store_down")]
    assert owed_at(T0, windows, T0 + 10 * hour) == T0 + 4 * hour
    assert owed_at(T0, windows, T0 + 3 * hour) is None  # past the run
    assert owed_at(T0, windows, T0 + 10 * hour, 5 * MINUTE) == T0 + 5 * MINUTE


def test_the_drain_wakes_for_a_held_entry_at_its_destinations_probe_not_its_own_time(
        sqlite_url: str, make_services: Any) -> None:
    """Seed 29: an entry held for a dead destination keeps a past ``next_attempt_at``; the
    claim takes it only as the destination's probe, so the wake is the probe's time (and
    never before a pause ends), not every minute."""
    from bench.simulate.firing import drain_wake
    from sluice.delivery.store import DeliveryStore

    services = make_services(sqlite_url)
    expire = timedelta(days=1)
    assert drain_wake(services.db, expire) is None
    entry, _ = DeliveryStore(services.db).enqueue("webhook", "http://127.0.0.1:7100/h", {"a": 1},
                                                  now=T0)
    key = "webhook:127.0.0.1:7100"
    probe = T0 + 30 * MINUTE
    with services.db.transaction() as tx:
        tx.execute("UPDATE delivery_queue SET held_by = :k, next_attempt_at = :t WHERE id = :id",
                   {"k": key, "t": T0 + MINUTE, "id": entry.id})
        tx.execute("INSERT INTO delivery_destinations (key, down_since, failures, next_probe_at, "
                   "updated_at) VALUES (:k, :t, 5, :p, :t)", {"k": key, "t": T0, "p": probe})
    assert drain_wake(services.db, expire) == probe
    with services.db.transaction() as tx:  # paused past the probe: the pause's end
        tx.execute("UPDATE delivery_destinations SET paused_until = :u WHERE key = :k",
                   {"u": T0 + 2 * 60 * MINUTE, "k": key})
    assert drain_wake(services.db, expire) == T0 + 2 * 60 * MINUTE
    with services.db.transaction() as tx:  # disabled: only the operator frees it; expiry
        tx.execute("UPDATE delivery_destinations SET paused_until = NULL, disabled_at = :t "
                   "WHERE key = :k", {"t": T0, "k": key})
    assert drain_wake(services.db, expire) == T0 + expire + timedelta(microseconds=1)
