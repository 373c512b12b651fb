"""The invariants, judged from what the peers received and from public state (the
delivery entries the API lists, the jobs' results), never from Sluice's internals.

- ``at_most_once``: a (channel, recipient, story) reaches its receiver at most once, plus
  ``SLUICE_DELIVERY_UNKNOWN_RESENDS`` (default 1) more when a send of it timed out after it
  arrived (an unknown outcome), plus one per operator redrive. A webhook receiver drops a
  repeated ``Idempotency-Key``, so for webhooks a new key for the same match counts.
- ``eventually_once``: a match whose feed and destination were up and whose rule did not
  change for three hours after the story was published has been received by then (a
  chat's destination: every chat of its channel, one API host; a webhook's: its own
  receiver, on a port of its own).
- ``owed_after_recovery``: a match a fault delayed is owed all the same: it has been
  received ``LIVENESS_AFTER`` into the first stretch of that length, from its story's
  publication on, clear of every fault window of its channel's destinations, of the
  stores' outages (and an hour after each) and of its feed's (and the feed's backoff
  after each: as long as the window, at most a day), unless it was settled for good
  (which ``no_attempt_burned`` judges) or the documented policy lets it rest unknown,
  judged from what its destination saw (``may_rest_unknown``: never from the entry's own
  status). No loss is excused by a fault window.
- ``pause_kept`` (engine; fairness for the isolation world's disable): while the operator
  has a destination paused or disabled, no request reaches it, even when the pause or
  disable landed between a drain's claim and its send; its matches are owed after the
  pause as after a fault window.
- ``operator_honoured`` (operator): an operator's enable or pause of a destination takes
  effect. A match whose entry a justified disable failed (a refusal to its destination)
  is owed again once the operator enabled the destination and redrove it.
- ``nothing_comes_back``: after the operator purged a match, or after its entry failed for
  good (a permanent refusal, the attempt limit, expiry), its receiver never gets it again.
- ``run_within_deadline``: every job run ends within its Lambda timeout (simulated time).
- ``bounded_tables``: ``job_runs``, ``ops_samples``, ``delivery_queue`` and the dead-letter
  tables at the end of a run of 90 days or more are within ``GROWTH_FACTOR`` of day 30.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple

from bench.simulate.peers import Receipt, Window
from bench.simulate.world import SimRule, World

GROWTH_FACTOR = 3.0
BOUNDED_TABLES = ("job_runs", "ops_samples", "delivery_queue", "queue_dead_letters",
                  "queue_quarantine")
Match = tuple[str, str, int]  # channel, recipient, story number
LIVENESS_AFTER = timedelta(hours=3)
# A feed that failed is retried on a backoff of up to a day: only a story from a feed that
# was up that long before is owed within LIVENESS_AFTER.
FEED_BACKOFF_CAP = timedelta(days=2)
FEED_BACKOFF_MAX = timedelta(days=1)  # sluice.rss.fetch.Backoff's cap
STORE_SETTLE = timedelta(hours=1)  # after a store outage, before a match is owed again
MAX_ATTEMPTS = 5  # docs/delivery.md: an entry fails for good after its fifth attempt
DEDUPLICATING = frozenset({"webhook"})  # receivers that drop a repeated Idempotency-Key


def unknown_resends() -> int:
    """The documented re-send of an unknown outcome to a channel that cannot deduplicate."""
    return int(os.environ.get("SLUICE_DELIVERY_UNKNOWN_RESENDS", "1"))


def may_rest_unknown(channel: str, unknown_sends: int, requests: int) -> bool:
    """Whether the documented policy may leave a match unsent for good as an unknown
    outcome, from what its destination saw: ``unknown_sends`` sends without an answer
    (timeouts after the request left, crashes right after it) among ``requests`` requests
    in all. An unknown outcome is resent while the attempt limit allows and, unless the
    channel deduplicates, ``SLUICE_DELIVERY_UNKNOWN_RESENDS`` times (docs/delivery.md): a
    chat rests after its second unknown send, a webhook only at its fifth attempt (every
    attempt is at least one request, so fewer requests than that cannot have used them)."""
    if unknown_sends < 1:
        return False
    if requests >= MAX_ATTEMPTS:
        return True
    return channel not in DEDUPLICATING and unknown_sends >= 1 + unknown_resends()


class Violation(NamedTuple):
    invariant: str
    at: datetime
    day: float
    detail: str


@dataclass
class Judge:
    start: datetime
    violations: list[Violation] = field(default_factory=list)
    received: Counter[Match] = field(default_factory=Counter)
    keys: dict[Match, set[str]] = field(default_factory=lambda: defaultdict(set))
    late: set[Match] = field(default_factory=set)
    # sends of a match whose outcome the sender could not know (a timeout after the
    # request left, a crash right after it, a store that failed before it was settled)
    unknown_sends: Counter[Match] = field(default_factory=Counter)
    redrives: Counter[Match] = field(default_factory=Counter)
    final: dict[Match, tuple[datetime, str]] = field(default_factory=dict)
    # entry id -> when the operator's listing first showed it failed, and its match
    failed_seen: dict[str, tuple[datetime, Match]] = field(default_factory=dict)
    failed_enqueued: dict[str, datetime] = field(default_factory=dict)  # entry id -> its enqueue

    def fail(self, invariant: str, at: datetime, detail: str) -> None:
        day = (at - self.start).total_seconds() / 86400
        self.violations.append(Violation(invariant, at, day, detail))

    def receipt(self, receipt: Receipt) -> None:
        match: Match = (receipt.channel, receipt.recipient, receipt.story)
        if match in self.final:
            since, why = self.final[match]
            self.fail("nothing_comes_back", receipt.at,
                      f"{_name(match)} received again after it was {why} at {since:%Y-%m-%d %H:%M}")
        self.received[match] += 1
        if receipt.key is not None:
            self.keys[match].add(receipt.key)
        allowed = 1 + self.redrives[match] + (unknown_resends() if match in self.late else 0)
        if receipt.late:
            self.late.add(match)
        count = (len(self.keys[match]) if receipt.channel == "webhook"
                 else self.received[match])
        if count > allowed:
            self.fail("at_most_once", receipt.at,
                      f"{_name(match)} received {count} times (allowed {allowed}"
                      f"{', an unknown outcome' if match in self.late else ''})")

    def settled_for_good(self, match: Match, at: datetime, why: str) -> None:
        self.final.setdefault(match, (at, why))

    def redriven(self, match: Match) -> None:
        self.final.pop(match, None)
        self.redrives[match] += 1

    def owed(self, match: Match, at: datetime, published: datetime,
             delayed: bool = False, resting: bool = False) -> None:
        """``delayed``: a fault window delayed the match (``owed_after_recovery``);
        ``resting``: its entry rests unknown after a timeout or a crash (excused)."""
        if self.received[match] or match in self.final or resting:
            return
        if delayed:
            self.fail("owed_after_recovery", at,
                      f"{_name(match)} (published {published:%Y-%m-%d %H:%M}) not received "
                      f"{LIVENESS_AFTER} into the first such stretch its feed, destinations "
                      "and stores were up, its rule unchanged")
        else:
            self.fail("eventually_once", at,
                      f"{_name(match)} (published {published:%Y-%m-%d %H:%M}) not received "
                      "although its feed and destination were up and its rule unchanged")

    def run_ended(self, job: str, at: datetime, took_s: float, timeout_s: int) -> None:
        if took_s > timeout_s:
            self.fail("run_within_deadline", at,
                      f"{job} ran {took_s:.0f} s of simulated time; its timeout is {timeout_s} s")

    def bounded(self, at: datetime, day30: dict[str, int], now: dict[str, int],
                kept_days: dict[str, int] | None = None) -> None:
        """``kept_days``: a table whose retention is longer than 30 days holds that many
        days at the end against 30 at day 30: its factor grows by that ratio."""
        for table in BOUNDED_TABLES:
            floor = max(day30.get(table, 0), 50)
            factor = GROWTH_FACTOR * max(1.0, (kept_days or {}).get(table, 30) / 30)
            if now.get(table, 0) > floor * factor:
                self.fail("bounded_tables", at,
                          f"{table}: {now[table]} rows, {day30.get(table, 0)} at day 30 "
                          f"(allowed x{factor:g})")


def feed_backoff(windows: list[Window]) -> list[Window]:
    """Each fault window of a feed, held on for the wait Sluice may still keep after it
    (``sluice.rss.fetch.Backoff``: doubling from 5 minutes, so the wait after a streak of
    failures is at most the streak's length and 5 minutes, capped at a day, then up to a
    tick of 10 minutes). The streak is the failures since the feed was last read: a window
    that begins before the wait after the one before has ended continues that streak (no
    read succeeded between them), so the wait after it is the whole streak's, not its own
    length's (seed 26: a day slow, then four hours rate-limited, then a day's wait)."""
    held: list[Window] = []
    start: datetime | None = None
    until: datetime | None = None
    for window in sorted(windows, key=lambda w: (w.start, w.end)):
        if start is None or until is None or window.start > until:
            start = window.start
        end = window.end + min(FEED_BACKOFF_MAX, window.end - start) + timedelta(minutes=15)
        held.append(Window(window.start, end, window.kind))
        until = end if until is None else max(until, end)
    return held


def owed_matches(world: World, rule: SimRule) -> list[tuple[datetime, Match, datetime, bool]]:
    """The matches ``rule`` must deliver (when, what, published, delayed by a fault): due
    ``LIVENESS_AFTER`` into the first stretch of that length from the story on clear of the
    faults (see ``owed_after_recovery``), while the story is still in its feed and the rule
    unchanged from 20 minutes before the story until then."""
    from bench.simulate.billing import owed_at

    tenant = next(t for t in world.tenants if t.scope == rule.scope)
    # A chat's faults are held as its API host's (one host per chat channel): a fault of
    # any destination on the same channel may delay this one, so the match is owed once
    # all of them are clear. A webhook receiver is a host of its own (``hosts.py``): only
    # its own faults may delay it.
    windows = [w for name, peer in sorted(world.destinations.items())
               if (name == f"webhook:{rule.recipient}" if rule.channel == "webhook"
                   else name.startswith(f"{rule.channel}:")) for w in peer.windows]
    stores = [Window(w.start, w.end + STORE_SETTLE, w.kind) for w in world.outages.windows]
    owed = []
    for name in tenant.feeds:
        feed = world.feeds[name]
        backoff = feed_backoff(feed.windows)
        for story in feed.stories:
            published = story.published
            if published < world.start or published + LIVENESS_AFTER > world.end:
                continue
            keyword = rule.keyword_at(published)
            if keyword is None or keyword not in story.words:
                continue
            clear = (_clear(windows, published - timedelta(hours=1), published + LIVENESS_AFTER)
                     and _clear(feed.windows, published - FEED_BACKOFF_CAP,
                                published + LIVENESS_AFTER)
                     and _clear(world.outages.windows, published - timedelta(hours=1),
                                published + LIVENESS_AFTER))
            due = (published + LIVENESS_AFTER if clear
                   else owed_at(published, [*windows, *stores, *backoff], world.end,
                                LIVENESS_AFTER))
            if due is None or not (rule.unchanged(published - timedelta(minutes=20), due)
                                   and story in feed.visible(due)
                                   and story in feed.visible(published + timedelta(hours=1))):
                continue
            owed.append((due, (rule.channel, rule.recipient, story.number), published,
                         not clear))
    return owed


def _clear(windows: list[Window], start: datetime, end: datetime) -> bool:
    return not any(w.start < end and start < w.end for w in windows)


def _name(match: Match) -> str:
    channel, recipient, story = match
    return f"story-{story} -> {channel}:{recipient}"
