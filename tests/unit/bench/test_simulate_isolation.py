"""The isolation world (``--limits``): delivery in production shapes, drawn without
running Sluice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bench.simulate import isolation as iso
from bench.simulate.hosts import hook_host
from bench.simulate.limits import reach_limits
from bench.simulate.world import generate
from sluice.delivery.chunking import SLACK_MAX_TEXT, TELEGRAM_MAX_TEXT

T0 = datetime(2026, 1, 5, tzinfo=UTC)


def test_the_reduced_runs_seeds_hold_every_production_shape() -> None:
    for seed in (1, 4):
        world = generate(seed, T0, 10)
        reach_limits(world, seed)
        found = world.isolation
        assert found is not None and found.start < world.end - iso.CLEAR
        assert not any(w.start < found.start + iso.CLEAR and found.start < w.end
                       for w in world.outages.windows)
        by = {}
        for m in found.messages:
            by.setdefault(m.destination, []).append(m)
        assert len(by[iso.GROUP]) == iso.BACKLOG  # thousands to one rate-limited group
        assert all(len(by[d]) == iso.QUIET_EACH * iso.WAVES for d in iso.QUIET)
        hosts = {hook_host(d.split(":", 1)[1]) for d in iso.SHARED_URLS}
        assert len(hosts) == 1  # many URLs on one host, one of them gone
        assert any(w.kind == "refuse" for w in world.destinations[iso.GONE_URL].windows)
        assert not any(world.destinations[d].windows for d in iso.SHARED_URLS[:-1])
        # a poison entry first on one receiver, another after good ones on a second
        first, late = by[iso.POISONED], by[iso.POISONED_LATE]
        assert first[0].number in found.poison and late[3].number in found.poison
        assert {("webhook", "hook-8-0", first[0].number)} < world.poison
        # chunked: longer than the channel's limit, one with a key and one without
        chunked = [m for m in found.messages if m.parts > 1]
        assert {m.destination for m in chunked} == set(iso.CHUNKED)
        assert all(len(m.text) > max(TELEGRAM_MAX_TEXT, SLACK_MAX_TEXT) for m in chunked)
        assert {m.key is not None for m in chunked} == {True, False}
        # operator actions land mid-run, each with its own trigger and a fallback; the
        # pause and the disable between a claim of the destination's entries and its send
        assert {t[0] for t in iso.TRIGGERS} == {"pause", "disable", "resume", "enable",
                                                 "replay"}
        assert {t[0] for t in iso.TRIGGERS if t[2].startswith(iso.CLAIMED)} == {
            "pause", "disable"}
        assert len(world.isolation_crashes) == 9
        # a partition later (the store never answers), no unbounded call inside it, and an
        # app's enqueue at each probe; and two days of state-cleanup the platform leaves out
        (hung,) = world.hung
        assert hung in world.outages.windows and hung.kind == "store_down"
        margin = timedelta(minutes=1)
        assert not any(hung.start - margin <= c.at < hung.end + margin for c in world.usage)
        assert found.probes and all(hung.start < p < hung.end for p in found.probes)
        (missed,) = world.missed
        assert missed.end - missed.start == timedelta(days=2) and missed.end < world.end


def test_the_fairness_bound_is_one_interval_and_the_destinations_own_spacing() -> None:
    assert iso.rate_key("telegram:-1009001") == ("telegram:-1009001", timedelta(seconds=3))
    assert iso.rate_key("telegram:9001")[1] == timedelta(seconds=1)
    assert iso.rate_key("webhook:hook-9-0") == ("webhook:127.0.0.1:7190",
                                                timedelta(milliseconds=100))
    assert iso.rate_key("webhook:hook-9-3")[0] == iso.rate_key("webhook:hook-9-0")[0]
