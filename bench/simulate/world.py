"""The world a seed generates: feeds and their stories, tenants and their alert rules,
the destinations' behaviours over time, and the operator's actions.

Everything comes from one ``random.Random(seed)``, drawn in a fixed order, so the same
seed and length give the same world. A story is matched by a rule when its words hold the
rule's keyword (``kwNN``, a token no other word contains), so the model knows what each
rule matches without running Sluice's matcher.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from bench.simulate.peers import Feed, FeedStory, Peer, Window

KEYWORDS = tuple(f"kw{n:02d}" for n in range(12))
FILLER = ("market", "energy", "health", "climate", "transport", "culture", "sport", "data")
CHANNELS = ("telegram", "slack", "webhook")


@dataclass
class RuleVersion:
    since: datetime
    keyword: str | None  # None: deleted


@dataclass
class SimRule:
    scope: str
    rule_id: str
    channel: str
    recipient: str
    versions: list[RuleVersion] = field(default_factory=list)

    def keyword_at(self, moment: datetime) -> str | None:
        found: str | None = None
        for version in self.versions:
            if version.since <= moment:
                found = version.keyword
        return found

    def unchanged(self, start: datetime, end: datetime) -> bool:
        return not any(start < v.since <= end for v in self.versions)


@dataclass
class Tenant:
    scope: str
    feeds: tuple[str, ...]
    rules: list[SimRule] = field(default_factory=list)


class UsageCall(NamedTuple):
    """One AI model call reported to the ledger (``record_usage``), billable."""

    at: datetime
    entry_id: str
    tenant_id: str
    user_id: str
    tokens: int


class ErasureCall(NamedTuple):
    """A user's erasure request, its grace window, and whether it is cancelled in it."""

    at: datetime
    subject: str
    tenant_id: str
    grace_days: int
    cancel_at: datetime | None
    confirm_at: datetime | None = None  # an operator confirms it (purge now) then


@dataclass
class World:
    start: datetime
    end: datetime
    feeds: dict[str, Feed]
    tenants: list[Tenant]
    destinations: dict[str, Peer]
    operator_at: list[datetime]  # when the operator looks at failed entries
    faults: dict[str, int]
    polar: Peer = field(default_factory=lambda: Peer("polar"))
    outages: Peer = field(default_factory=lambda: Peer("stores"))  # store_down, redis_down
    usage: list[UsageCall] = field(default_factory=list)
    erasures: list[ErasureCall] = field(default_factory=list)
    # outage windows that begin only when the code reaches a named point in them
    armed: dict[Window, str] = field(default_factory=dict)
    # (story number, destination) -> the latest moment the story's entry to it can have
    # been enqueued (a lone story of --limits, its feed and the stores clear: the tick after
    # it, with a margin). Only that destination's: another rule may match the story first
    # much later (edited to a word it has), a first match with its own expiry
    enqueued_by: dict[tuple[int, str], datetime] = field(default_factory=dict)
    # the calls whose event Polar refuses for good (a 422 naming it), by entry id
    polar_refuses: set[str] = field(default_factory=set)
    # (when, user, tenant): a foreign producer (the TypeScript one) pushes a malformed retry
    # envelope of that user's call onto the ledger's Redis retry queue
    foreign: list[tuple[datetime, str, str]] = field(default_factory=list)
    # windows in which SQS answers at most one send a minute (a throttled endpoint: the
    # others get no answer); --limits only
    sqs_throttled: list[Window] = field(default_factory=list)
    # (story number, destination) -> by when its receiver has it: a lone story published
    # inside an SQS window (--limits), its feed, destination and the stores clear, is
    # received by the tick after it (``built_in_its_tick``)
    received_by: dict[tuple[int, str], datetime] = field(default_factory=dict)
    # (when, erasure, destination, number): the app's own notification to the erasure's
    # user (an export ready), enqueued through ``sluice.enqueue_delivery`` naming them as
    # its subject, its text marked ``story-<number>`` (no feed's) so the receiver's record
    # names it; --limits
    notices: list[tuple[datetime, ErasureCall, str, int]] = field(default_factory=list)
    # delivery in production shapes (--limits; isolation.py's Plan), and the matches a
    # receiver answers 500 to (a poison entry among good ones)
    isolation: Any = None
    poison: set[tuple[str, str, int]] = field(default_factory=set)
    # a receiver refuses these for good (422), and runs out of memory sending these once
    rejected: set[tuple[str, str, int]] = field(default_factory=set)
    oom: set[tuple[str, str, int]] = field(default_factory=set)
    isolation_crashes: list[tuple[datetime, str]] = field(default_factory=list)
    # store outages that are partitions (the server never answers: outages.py), and the
    # days the platform does not invoke state-cleanup (missed runs; --limits)
    hung: set[Window] = field(default_factory=set)
    missed: list[Window] = field(default_factory=list)

    def isolation_crashes_to(self) -> list[str]:
        """The destinations the isolation world's targeted crashes fall on."""
        return [point.split("@", 1)[1] for _, point in self.isolation_crashes if "@" in point]

    def rules(self) -> list[SimRule]:
        return [rule for tenant in self.tenants for rule in tenant.rules]


def _windows(rng: random.Random, start: datetime, end: datetime, kinds: tuple[str, ...],
             per_month: float, hours: tuple[float, float], faults: dict[str, int]) -> list[Window]:
    """Fault windows at random times: ``per_month`` on average, each ``hours`` long."""
    windows: list[Window] = []
    span_h = (end - start).total_seconds() / 3600
    count = int(rng.random() * per_month * 2 * span_h / 720 + 0.5)
    for _ in range(count):
        at = start + timedelta(hours=rng.uniform(1, span_h))
        kind = rng.choice(kinds)
        length = timedelta(hours=rng.uniform(*hours))
        windows.append(Window(at, at + length, kind))
        faults[kind] = faults.get(kind, 0) + 1
    windows.sort()
    return windows


def _stories(rng: random.Random, name: str, start: datetime, end: datetime,
             numbers: list[int]) -> list[FeedStory]:
    """A feed's rhythm: a mean gap between stories, quiet spells, bursts."""
    rhythm = rng.choice(("busy", "daily", "quiet"))
    mean_h = {"busy": 3.0, "daily": 20.0, "quiet": 24.0 * 12}[rhythm]
    stories: list[FeedStory] = []
    at = start - timedelta(hours=rng.uniform(1, 48))
    while at < end:
        burst = rng.random() < 0.03
        for _ in range(rng.randint(5, 12) if burst else 1):
            numbers[0] += 1
            words = tuple(rng.sample(KEYWORDS, rng.randint(1, 2)) + rng.sample(FILLER, 2))
            stories.append(FeedStory(numbers[0], at, words))
            at += timedelta(minutes=rng.uniform(1, 5))
        at += timedelta(hours=rng.expovariate(1 / mean_h))
    return stories


HORIZON_DAYS = 365  # the world is drawn for a year (or longer runs): a shorter run is its prefix


def generate(seed: int, start: datetime, days: int) -> World:
    rng = random.Random(seed)
    stop = start + timedelta(days=days)
    days = max(days, HORIZON_DAYS)
    end = start + timedelta(days=days)
    faults: dict[str, int] = {}
    numbers = [0]
    feeds: dict[str, Feed] = {}
    for n in range(rng.randint(3, 5)):
        name = f"feed-{n}"
        feed = Feed(name, _windows(rng, start, end, ("down", "slow", "malformed", "ratelimit"),
                                   1.0, (0.5, 30.0), faults))
        feed.stories = _stories(rng, name, start, end, numbers)
        if rng.random() < 0.15:  # a feed that vanishes for good
            gone = start + timedelta(days=rng.uniform(days / 3, days))
            feed.windows.append(Window(gone, end + timedelta(days=1), "vanished"))
            faults["vanished"] = faults.get("vanished", 0) + 1
        feeds[name] = feed
    destinations: dict[str, Peer] = {}
    tenants: list[Tenant] = []
    for t in range(rng.randint(2, 4)):
        scope = f"tenant-{t}"
        chosen = tuple(sorted(rng.sample(sorted(feeds), rng.randint(1, min(3, len(feeds))))))
        tenant = Tenant(scope, chosen)
        for r in range(rng.randint(1, 3)):
            channel = rng.choice(CHANNELS)
            recipient = (f"{-1000 - t * 10 - r}" if channel == "telegram"
                         else f"C{t}{r}" if channel == "slack" else f"hook-{t}-{r}")
            rule = SimRule(scope, f"rule-{t}-{r}", channel, recipient,
                           [RuleVersion(start, rng.choice(KEYWORDS))])
            edits = int(rng.random() * days / 20)
            for moment in sorted(start + timedelta(days=rng.uniform(1, days))
                                 for _ in range(edits)):
                deleted = rng.random() < 0.2
                rule.versions.append(RuleVersion(moment, None if deleted
                                                 else rng.choice(KEYWORDS)))
                faults["rule_edit"] = faults.get("rule_edit", 0) + 1
                if deleted:
                    break
            kinds = ("down", "late", "ratelimit", "refuse")
            destinations[f"{channel}:{recipient}"] = Peer(
                f"{channel}:{recipient}", _windows(rng, start, end, kinds, 1.5, (0.2, 40.0),
                                                   faults))
            tenant.rules.append(rule)
        tenants.append(tenant)
    operator_at = sorted(start + timedelta(days=rng.uniform(1, days))
                         for _ in range(max(1, days // 10)))
    # Faults counted are those that begin within the run.
    counted: dict[str, int] = {}
    for peer in [*feeds.values(), *destinations.values()]:
        for window in peer.windows:
            if window.start < stop:
                counted[window.kind] = counted.get(window.kind, 0) + 1
    counted["rule_edit"] = sum(1 for rule in (r for t in tenants for r in t.rules)
                               for v in rule.versions[1:] if v.since < stop)
    world = World(start, stop, feeds, tenants, destinations,
                  [moment for moment in operator_at if moment < stop],
                  {k: v for k, v in counted.items() if v})
    _billing(world, seed, end)
    _polar_refusals(world, seed)
    _erasures(world, seed, end)
    return world


POLAR_REFUSES = 0.002  # of the calls: about one a month in the busier worlds


def _polar_refusals(world: World, seed: int) -> None:
    """The events Polar refuses for good (its validation answers 422 naming the event), from
    a generator of their own: the calls, and the rest of the world, are drawn as before."""
    rng = random.Random(f"polar-refusal-{seed}")
    world.polar_refuses = {call.entry_id for call in world.usage if rng.random() < POLAR_REFUSES}
    counted = sum(1 for call in world.usage
                  if call.entry_id in world.polar_refuses and call.at < world.end)
    if counted:
        world.faults["polar_refuse"] = counted


def _erasures(world: World, seed: int, end: datetime) -> None:
    """About one erasure request a month, for a user who made AI calls, with a grace window
    of 1-14 days; a quarter are cancelled within it (a generator of their own)."""
    rng = random.Random(f"erasure-{seed}")
    span_days = (end - world.start).total_seconds() / 86400
    for _ in range(int(span_days / 30)):
        at = world.start + timedelta(days=rng.uniform(1, span_days))
        t = rng.randrange(len(world.tenants))
        grace = rng.randint(1, 14)
        cancel = (at + timedelta(days=rng.uniform(0, grace)) if rng.random() < 0.25
                  else None)
        world.erasures.append(ErasureCall(at, f"user-{t}-{rng.randint(0, 4)}",
                                          f"org-{world.tenants[t].scope}", grace, cancel))
    # an operator confirming some early, within their window (the purge is then at once),
    # from a generator of its own so the requests are drawn as before
    early = random.Random(f"erasure-confirm-{seed}")
    world.erasures = [call._replace(confirm_at=call.at + timedelta(
                          days=early.uniform(0, call.grace_days)))
                      if early.random() < 0.15 and call.cancel_at is None else call
                      for call in world.erasures]
    world.erasures.sort()
    counted = sum(1 for e in world.erasures if e.at < world.end)
    if counted:
        world.faults["erasure"] = counted
    confirmed = sum(1 for e in world.erasures if e.confirm_at and e.confirm_at < world.end)
    if confirmed:
        world.faults["erasure_confirm"] = confirmed


def _billing(world: World, seed: int, end: datetime) -> None:
    """AI usage, Polar's behaviours and the stores' outages, from a generator of their own
    (the rest of a seed's world is the same with or without them)."""
    rng = random.Random(f"billing-{seed}")
    start, drawn = world.start, dict[str, int]()
    world.polar = Peer("polar", _windows(rng, start, end, ("down", "ratelimit", "error", "late"),
                                         1.0, (0.1, 12.0), drawn))
    world.outages = Peer("stores", _windows(rng, start, end, ("store_down", "redis_down"),
                                            0.5, (0.05, 1.5), drawn))
    for t, tenant in enumerate(world.tenants):
        at = start + timedelta(hours=rng.uniform(0, 12))
        n = 0
        while at < end:
            for _ in range(rng.randint(1, 4)):  # a user's session: a few calls
                n += 1
                world.usage.append(UsageCall(at, f"call-{t}-{n}", f"org-{tenant.scope}",
                                             f"user-{t}-{rng.randint(0, 4)}",
                                             rng.randint(10, 5000)))
                at += timedelta(seconds=rng.uniform(5, 120))
            at += timedelta(hours=rng.expovariate(1 / 12))
    world.usage.sort()
    names = {"down": "polar_down", "ratelimit": "polar_ratelimit", "error": "polar_error",
             "late": "polar_late", "store_down": "store_down", "redis_down": "redis_down"}
    for window in [*world.polar.windows, *world.outages.windows]:
        if window.start < world.end:
            kind = names[window.kind]
            world.faults[kind] = world.faults.get(kind, 0) + 1
