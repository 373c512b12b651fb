"""Worlds that reach the limits (``--limits``; ``python -m bench mutate`` always uses it).

A seed's drawn world rarely meets Sluice's limits in a few weeks: drains far from their
budget, no destination down past the expiry, no rate saturated, faults that must coincide
apart. ``reach_limits`` adds to the world, from ``random.Random("limits-<seed>")`` and
within its first ``SPAN_DAYS`` (so a short run sees all of it), on purpose:

- every feed fault (malformed, slow, 429, down) on a feed the tenants read;
- for each destination in turn: a permanent refusal; *down for 26 hours*, past the
  delivery expiry (a day), so entries expire and the rest go out in one backlog when it
  is back; *late* (every send times out after it arrived) while a burst of stories
  matches its rule, so a drain runs into its budget and attempts run out; a *429* window
  under another burst, so the rates saturate; a *pause* by the operator as long as the
  down window (past the expiry) under a third burst, the peer up meanwhile: nothing may
  reach it while paused and nothing may expire for it;
- bursts of ``BURST`` stories within two minutes that every rule of a tenant matches; for
  each channel, one to a destination that is up (every rate met at once, a crash armed
  right after a claim) and one while it answers late (each send an unknown outcome);
- Polar down, failing (500), late and rate-limiting, each with calls made inside it, and
  calls made while the store or Redis is away; a burst of six calls while Polar fails
  (more rows than a run may try in a row) and a lone call meeting a 45-minute Polar
  outage (no run reaches three failures in a row: only the run-end refund keeps its
  attempts);
- a store outage that begins while the late burst is being sent (a message in flight when
  the store drops) and a Redis outage under the 429 burst, each with a crash point armed
  inside it;
- the sender dying right after a send three times in a row when the late window ends
  (one entry's lease lapses again and again);
- faults that coincide on one entry or one step on purpose: the store flapping twelve
  times, each drop armed at ``redrive.after_claim`` (it goes away right after
  ledger-redrive claimed the entries that waited in Redis through the store outage), and
  in the middle of them the run dying at that point too, its claim left in processing; a
  lone story to a webhook whose host *hangs* (the request taken, never answered, the
  message not delivered) through its first four sends, one to a chat that goes down right
  after it for 28 hours (its entry expires a day after it was enqueued), one to a chat that hangs
  through its first send only (its one documented resend delivers it); a lone story to
  a chat whose sender dies right after each send, the crashes targeted at that
  destination so they fall on the one entry;
- an erasure whose grace window ends within the run, one cancelled within its window
  (which the operator then confirms: refused, 409), and one the operator confirms early,
  within its window (purged at once);
- two webhook receivers on their own ports, one down for four hours while a story goes
  to the other every ten minutes for an hour: each is a destination of its own (its host
  and port), so the one that is up does not wait for the other (``eventually_once``);
- Polar refusing one event for good (a 422 naming it) between two it takes, Polar and the
  stores up: the refused row must not be sent again, nor hold the two behind it;
- before the first erasure's purge, a malformed retry envelope of its user pushed by a
  foreign producer onto the ledger's Redis retry queue;
- a rule edit; a drain whose dependency raises (an error run) under the first burst to an
  up destination, and a second invocation of the drain while a run of it is alive;
- rule ids as a client names them, per scope (``rule-0``, ``rule-1``...: rule ids are the
  client's, unique only within a scope), so tenants' rules share ids, and a lone story on
  a feed two tenants read that the first rule of each matches (two matches, one rule id);
- the app's own notification naming a user (``subject_user_id``) enqueued six hours
  before an erasure's grace window ends, to a chat that then goes down until four hours
  past it: the purge must take the waiting entry, so the chat never gets it
  (``nothing_comes_back``, judged from the chat's record);
- SQS throttled for two hours from day 5.8 on (one send a minute answered, the rest time
  out): the tick's global message goes and its first per-build message does not, so the
  tick builds that key inline; a lone story per tenant inside it, each owed to the
  destination of its first rule no earlier refusal still holds disabled by the tick after it (``built_in_its_tick``, engine);
- an *answered outage* from day 8.2: a destination that answers 500 to every request
  for an hour under a burst, so two entries are answered a failure there before any
  success (the receiver is held, the first one's attempt given back: ``streaks.py``);
- delivery in production shapes (``isolation.py``: a backlog of thousands to one group
  beside quiet destinations, URLs of one host with one gone, poison entries, chunked
  messages, operator actions in the middle of a drain run, a partition of the store) and
  two days of missed ``state-cleanup`` runs (``missed.py``), drawn last.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime, timedelta

from bench.simulate import isolation, missed
from bench.simulate.peers import Feed, FeedStory, Peer, Window
from bench.simulate.world import FILLER, ErasureCall, RuleVersion, SimRule, UsageCall, World

REDRIVE_EVERY = timedelta(minutes=5)  # ledger-redrive's rate

SPAN_DAYS = 9
TEN_MINUTES = timedelta(minutes=10)  # the rss tick's rate: a lone story is fetched on it
FLAPS = 12  # more store drops under one ledger-redrive entry than its ten attempts
BURST = 14
EXPIRY_PAST = timedelta(hours=26)
# a lone story in an SQS window is received by the tick after it, with this margin for
# the drain (its next minute) and its sends
PROMPT_MARGIN = timedelta(minutes=5)
NOTICE_NUMBERS = 1_000_000  # an app notice's marker numbers, above every story's


def _at(world: World, day: float) -> datetime:
    return world.start + timedelta(days=day)


def _add(peer: Peer, world: World, start: datetime, hours: float, kind: str,
         fault: str | None = None) -> Window:
    window = Window(start, start + timedelta(hours=hours), kind)
    peer.windows.append(window)
    peer.windows.sort()
    if start < world.end:
        name = fault or kind
        world.faults[name] = world.faults.get(name, 0) + 1
    return window


def _pause(world: World, seed: int, name: str) -> None:
    """The operator pauses ``name`` as long as the down window (past the expiry) under a
    burst: nothing may reach it meanwhile, nothing may expire for it. Drawn from its own
    generator, after everything else, so the rest of the world is as it was."""
    rng = random.Random(f"limits-pause-{seed}")
    start = _at(world, 3.2 + rng.uniform(0, 0.05))
    _add(world.destinations[name], world, start, EXPIRY_PAST.total_seconds() / 3600, "paused")
    numbers = [max((s.number for f in world.feeds.values() for s in f.stories), default=0)]
    _burst(world, start + timedelta(minutes=20), name, numbers, rng)


def reach_limits(world: World, seed: int) -> list[tuple[datetime, str]]:
    """Add the limits' faults and load to ``world``; returns the crashes to arm (when,
    point)."""
    rng = random.Random(f"limits-{seed}")
    read = sorted({name for tenant in world.tenants for name in tenant.feeds})
    feed = world.feeds[read[0]]
    for day, kind in ((1.2, "malformed"), (2.1, "slow"), (3.3, "ratelimit"), (4.4, "down")):
        _add(feed, world, _at(world, day + rng.uniform(0, 0.1)), rng.uniform(1, 2), kind)
    destinations = sorted(world.destinations)
    plan = [("refuse", 1.5, 2.0), ("down", 2.0, EXPIRY_PAST.total_seconds() / 3600),
            ("late", 5.0, 3.0), ("ratelimit", 6.5, 2.0)]
    bursts: list[tuple[datetime, str]] = []
    for n, (kind, day, hours) in enumerate(plan):
        name = destinations[n % len(destinations)]
        start = _at(world, day + rng.uniform(0, 0.05))
        _add(world.destinations[name], world, start, hours, kind)
        if kind in ("late", "ratelimit"):
            bursts.append((start + timedelta(minutes=20), name))
    numbers = [max((s.number for f in world.feeds.values() for s in f.stories), default=0)]
    for at, name in bursts:
        _burst(world, at, name, numbers, rng)
    late_burst, rate_burst = bursts[0][0], bursts[1][0]
    late_end = world.destinations[destinations[2 % len(destinations)]].windows
    back = next(w.end for w in late_end if w.kind == "late" and w.start <= late_burst)
    store = _add(world.outages, world, late_burst + timedelta(minutes=1, seconds=30), 0.5,
                 "store_down")
    redis = _add(world.outages, world, rate_burst + timedelta(seconds=20), 0.3, "redis_down")
    names = {"down": "polar_down", "error": "polar_error", "late": "polar_late",
             "ratelimit": "polar_ratelimit"}
    for day, kind in ((1.1, "down"), (2.6, "error"), (3.6, "late"), (4.6, "ratelimit")):
        window = _add(world.polar, world, _at(world, day), rng.uniform(0.5, 1.0), kind,
                      names[kind])
        for t, tenant in enumerate(world.tenants):
            world.usage.append(UsageCall(window.start + timedelta(minutes=5 + t),
                                         f"limits-{kind}-{t}", f"org-{tenant.scope}",
                                         f"user-{t}-{rng.randint(0, 4)}", rng.randint(10, 5000)))
    for window in (store, redis):  # calls made while a store is away (Redis's retry queue)
        for t, tenant in enumerate(world.tenants):
            world.usage.append(UsageCall(window.start + timedelta(minutes=2, seconds=t),
                                         f"limits-{window.kind}-{t}", f"org-{tenant.scope}",
                                         f"user-{t}-{rng.randint(0, 4)}", rng.randint(10, 5000)))
    crashes: list[tuple[datetime, str]] = []
    channels: dict[str, str] = {}
    for name in destinations:
        channels.setdefault(name.split(":", 1)[0], name)
    for n, name in enumerate(channels.values()):
        # a burst to a destination that is up: every rate is met at once
        at = _at(world, 7.2 + 0.05 * n)
        _burst(world, at, name, numbers, rng)
        crashes.append((at + timedelta(seconds=30), "delivery.after_claim"))
        if n == 0:
            # the drain's dependency failing in its next run (an error run, its lease
            # released), and EventBridge invoking the drain again while a run is alive
            crashes += [(at + timedelta(seconds=90), "error:delivery.after_claim"),
                        (at + timedelta(minutes=3), "dup:delivery.after_send")]
        # and answering late under another burst: each send an unknown outcome
        late = _add(world.destinations[name], world, _at(world, 7.6 + 0.1 * n), 1.0, "late")
        _burst(world, late.start + timedelta(minutes=5), name, numbers, rng)
    world.usage.sort()
    who = rng.randrange(len(world.tenants))
    scope = world.tenants[who].scope
    world.erasures.append(ErasureCall(_at(world, 1.0), f"user-{who}-0", f"org-{scope}", 1,
                                      None))
    world.erasures.append(ErasureCall(_at(world, 1.3), f"user-{who}-1", f"org-{scope}", 3,
                                      _at(world, 2.0), confirm_at=_at(world, 2.2)))
    # the operator confirms one early, within its grace window: purged at once
    world.erasures.append(ErasureCall(_at(world, 1.6), f"user-{who}-2", f"org-{scope}", 7,
                                      None, confirm_at=_at(world, 2.7)))
    world.erasures.sort()
    world.faults["erasure"] = sum(1 for e in world.erasures if e.at < world.end)
    world.faults["erasure_confirm"] = sum(1 for e in world.erasures
                                          if e.confirm_at and e.confirm_at < world.end)
    # a malformed retry envelope of the first one's user, pushed before the purge: it is
    # dead-lettered, named malformed, and swept with the user's data
    world.foreign.append((_at(world, 1.5), f"user-{who}-0", f"org-{scope}"))
    world.faults["malformed_entry"] = 1
    rule = world.tenants[0].rules[0]
    edit = _at(world, 3.0 + rng.uniform(0, 0.5))
    if rule.keyword_at(edit) is not None and not any(v.since > edit for v in rule.versions):
        rule.versions.append(RuleVersion(edit, rng.choice(("kw00", "kw05", "kw10"))))
        world.faults["rule_edit"] = world.faults.get("rule_edit", 0) + 1
    _metering_limits(world, rng)
    _polar_refusal(world, seed)
    _hooks_apart(world, seed)
    flap_crash = _store_flaps(world, store.end)
    lonely = _lone_stories(world, rng)
    _pause(world, seed, destinations[len(plan) % len(destinations)])
    _client_rule_ids(world, seed)
    _notices(world)
    _sqs_throttled(world, seed)
    _answered_outage(world, seed)
    isolation.plan(world, seed)  # last: it adds destinations the worlds above do not pick
    missed.plan(world)
    return [*lonely, flap_crash, (store.start + timedelta(seconds=30), "delivery.after_send"),
            (redis.start + timedelta(seconds=30), "redrive.after_claim"),
            (_at(world, 3.6) + timedelta(minutes=6), "metering.after_send"),
            (_at(world, 2.0) + timedelta(minutes=1), "erasure.after_commit"),
            (late_burst + timedelta(seconds=40), "consumer.after_handler"),
            # the backlog after the late window: the sender dies right after a send three
            # times in a row, so one entry's lease lapses again and again
            *((back + timedelta(minutes=1 + 3 * n), "delivery.after_send") for n in range(3)),
            *crashes, *world.isolation_crashes]


def _burst(world: World, at: datetime, destination: str, numbers: list[int],
           rng: random.Random) -> None:
    """``BURST`` stories within two minutes on a feed of the tenant whose rule sends to
    ``destination``, each matched by every rule of that tenant."""
    tenant = next((t for t in world.tenants for r in t.rules
                   if f"{r.channel}:{r.recipient}" == destination), world.tenants[0])
    keywords = sorted({kw for r in tenant.rules if (kw := r.keyword_at(at)) is not None})
    feed = world.feeds[tenant.feeds[0]]
    for n in range(BURST):
        numbers[0] += 1
        words = (*keywords, *rng.sample(FILLER, 2))
        feed.stories.append(FeedStory(numbers[0], at + timedelta(seconds=8 * n), words))
    feed.stories.sort(key=lambda s: (s.published, s.number))
    world.faults["burst"] = world.faults.get("burst", 0) + 1


def _metering_limits(world: World, rng: random.Random) -> None:
    """More rows than a run may try in a row meet Polar failing (a burst of calls inside
    its 500 window), and a lone row meets a long Polar outage (no run of it reaches three
    transient answers in a row, so only the run-end refund keeps its attempts)."""
    error = next(w for w in world.polar.windows if w.kind == "error" and w.start >= world.start
                 and w.start == _at(world, 2.6))
    tenant = world.tenants[-1]
    for n in range(6):
        world.usage.append(UsageCall(error.start + timedelta(minutes=12, seconds=20 * n),
                                     f"limits-polar-burst-{n}", f"org-{tenant.scope}",
                                     f"user-{len(world.tenants) - 1}-{rng.randint(0, 4)}",
                                     rng.randint(10, 5000)))
    lone = _add(world.polar, world, _at(world, 5.4), 0.75, "error", "polar_error")
    world.usage.append(UsageCall(lone.start + timedelta(minutes=1), "limits-polar-lone",
                                 f"org-{tenant.scope}",
                                 f"user-{len(world.tenants) - 1}-{rng.randint(0, 4)}",
                                 rng.randint(10, 5000)))
    world.usage.sort()


def _hooks_apart(world: World, seed: int) -> None:
    """On day 6.9 one webhook receiver is down for four hours, with a story for it, while a
    story goes to another (of another tenant when there is one, on a port of its own) every
    ten minutes for an hour; from a generator of its own, so the rest is drawn as before."""
    hooks = sorted(name for name in world.destinations if name.startswith("webhook:"))
    if len(hooks) < 2:
        return
    rng = random.Random(f"limits-hooks-{seed}")
    down = hooks[0]
    tenant_of = {f"{r.channel}:{r.recipient}": r.scope for r in world.rules()}
    up = next((h for h in hooks if tenant_of.get(h) != tenant_of.get(down)), hooks[1])
    start = _at(world, 6.9 + rng.uniform(0, 0.05))
    _add(world.destinations[down], world, start, 4.0, "down")
    _lone(world, down, start + timedelta(minutes=1), rng)
    for n in range(7):
        _lone(world, up, start + timedelta(minutes=15 + 10 * n), rng)


def _answered_outage(world: World, seed: int) -> None:
    """From day 8.2, a destination (a webhook when there is one) that answers 500 to every request for an hour, under a
    burst: the first entry's failure names it alone, the second's shows the receiver is
    what fails (held, the first one's attempt given back). The first destination of the
    world's own clear for the window and two hours around it; from a generator of its own,
    so the rest is drawn as before."""
    rng = random.Random(f"limits-answered-{seed}")
    # a webhook first: its receiver's rate (ten a second) leaves room for the in-process
    # retries of each 500 within one send
    for name in sorted(world.destinations, key=lambda n: (not n.startswith("webhook:"), n)):
        peer = world.destinations[name]
        start = _at(world, 8.2 + rng.uniform(0, 0.05))
        if _clear(peer, start - timedelta(hours=2), start + timedelta(hours=3)):
            _add(peer, world, start, 1.0, "error", "answered_outage")
            numbers = [max((s.number for f in world.feeds.values() for s in f.stories),
                           default=0)]
            _burst(world, start + timedelta(minutes=5), name, numbers, rng)
            return


def _polar_refusal(world: World, seed: int) -> None:
    """Three calls 20 s apart on day 6.2, the middle one's event refused by Polar for good
    (a 422 naming it); from a generator of its own, so the rest is drawn as before."""
    rng = random.Random(f"limits-polar-refusal-{seed}")
    at = _at(world, 6.2 + rng.uniform(0, 0.05))
    for n in range(3):
        world.usage.append(UsageCall(at + timedelta(seconds=20 * n), f"limits-refused-{n}",
                                     f"org-{world.tenants[0].scope}",
                                     f"user-0-{rng.randint(0, 4)}", rng.randint(10, 5000)))
    world.polar_refuses.add("limits-refused-1")
    world.faults["polar_refuse"] = world.faults.get("polar_refuse", 0) + 1
    world.usage.sort()

def _client_rule_ids(world: World, seed: int) -> None:
    """Each tenant's rules get the ids a client gives them (``rule-<n>``, unique within the
    scope only), and one lone story on a feed two tenants read is matched by the first rule
    of each: two matches under one rule id, each owed to its own destination. Drawn from a
    generator of its own, after everything else, so the rest of the world is as it was."""
    for tenant in world.tenants:
        for n, rule in enumerate(tenant.rules):
            rule.rule_id = f"rule-{n}"
    rng = random.Random(f"limits-rule-ids-{seed}")
    pairs = [(a, b, feed) for i, a in enumerate(world.tenants) for b in world.tenants[i + 1:]
             for feed in sorted(set(a.feeds) & set(b.feeds))]
    if not pairs:
        return
    first, second, name = pairs[0]
    rules = (first.rules[0], second.rules[0])
    feed = world.feeds[name]
    at = world.start + TEN_MINUTES * -(-timedelta(days=6.0) // TEN_MINUTES) \
        + timedelta(seconds=30)
    while at < _at(world, SPAN_DAYS):
        keywords = [rule.keyword_at(at) for rule in rules]
        if _owed_by_next_tick(world, rules, [feed], at):
            number = max((s.number for f in world.feeds.values() for s in f.stories),
                         default=0) + 1
            words = tuple(sorted({k for k in keywords if k is not None}))
            feed.stories.append(FeedStory(number, at, (*words, *rng.sample(FILLER, 2))))
            feed.stories.sort(key=lambda s: (s.published, s.number))
            world.faults["shared_rule_id"] = world.faults.get("shared_rule_id", 0) + 1
            return
        at += TEN_MINUTES


def _owed_by_next_tick(world: World, rules: Sequence[SimRule], feeds: Sequence[Feed],
                       at: datetime) -> bool:
    """Whether a lone story at ``at`` matched by each of ``rules`` is owed by the tick after
    it: every rule has a keyword then and stays unchanged from an hour before to four hours
    after, every destination of their channels and the stores are clear from two hours
    before, no rule's destination is still disabled by an earlier refusal, ``feeds`` are
    clear from two days before (their backoff), and no story near matches."""
    keywords = [rule.keyword_at(at) for rule in rules]
    channels = {rule.channel for rule in rules}
    return (all(keyword is not None for keyword in keywords)
            and not any(_held_disabled(world, f"{rule.channel}:{rule.recipient}", at)
                        for rule in rules)
            and all(rule.unchanged(at - timedelta(hours=1), at + timedelta(hours=4))
                    for rule in rules)
            and all(_clear(peer, at - timedelta(hours=2), at + timedelta(hours=4))
                    for key, peer in world.destinations.items()
                    if key.split(":", 1)[0] in channels)
            and all(_clear(feed, at - timedelta(days=2), at + timedelta(hours=4))
                    for feed in feeds)
            and _clear(world.outages, at - timedelta(hours=2), at + timedelta(hours=4))
            and not any(_matches_near(world, keyword, at) for keyword in keywords))


def _store_flaps(world: World, after: datetime) -> tuple[datetime, str]:
    """The store drops ``FLAPS`` times, each right after ledger-redrive claimed (an outage
    window armed at ``redrive.after_claim`` around each of its firings), from the first
    firing after ``after`` (when the entries that waited in Redis go in). Returns a crash
    at that same point in the middle of them: the run dies with its claim in processing,
    the store gone."""
    grid = world.start + REDRIVE_EVERY * -(-(after + timedelta(seconds=1) - world.start)
                                            // REDRIVE_EVERY)
    for n in range(FLAPS):
        firing = grid + n * REDRIVE_EVERY
        begins = max(firing - timedelta(seconds=30), after)
        window = _add(world.outages, world, begins, (firing + timedelta(seconds=90) - begins)
                      / timedelta(hours=1), "store_down", "store_flap")
        world.armed[window] = "redrive.after_claim"
    return grid + FLAPS // 2 * REDRIVE_EVERY - timedelta(seconds=30), "redrive.after_claim"


def _lone_stories(world: World, rng: random.Random) -> list[tuple[datetime, str]]:
    """A lone story to a webhook whose host hangs through its first four sends, one to a
    chat whose sender dies right after each send (the crashes targeted at it), and one to
    a chat that hangs through its first send; returns those crashes."""
    crashes: list[tuple[datetime, str]] = []
    hooks = sorted(name for name in world.destinations if name.startswith("webhook:"))
    if hooks:
        at = _quiet(world, hooks[0], 8.2)
        if at is not None and _lone(world, hooks[0], at, rng):
            # the tick fetches it at the next ten minutes; its sends then come at about 0,
            # 1, 2, 4 and 14 minutes (the schedule's 5 s, 25 s, 2 min, 10 min, on the
            # drain's minute): the host hangs through the first four
            tick = at + TEN_MINUTES - timedelta(seconds=30)
            _add(world.destinations[hooks[0]], world, tick - timedelta(minutes=1),
                 10 / 60, "hang")
    chats = sorted(name for name in world.destinations if not name.startswith("webhook:"))
    if chats:
        # a lone story to a chat that goes down right after it, for 28 hours: its entry
        # must expire a day after it was enqueued, never be sent when the chat is back
        at = _quiet(world, chats[0], 0.25)
        if at is not None and _lone(world, chats[0], at, rng):
            tick = at + TEN_MINUTES - timedelta(seconds=30)
            _add(world.destinations[chats[0]], world, at + timedelta(minutes=1),
                 EXPIRY_PAST.total_seconds() / 3600 + 2, "down")
            number = max(s.number for f in world.feeds.values() for s in f.stories)
            world.enqueued_by[(number, chats[0])] = tick + timedelta(minutes=5)
        at = _quiet(world, chats[0], 8.6)
        if at is not None and _lone(world, chats[0], at, rng):
            crashes += [(at, f"delivery.after_send@{chats[0]}")] * 3
        # a chat that hangs through the first send only: its one documented resend goes
        at = _quiet(world, chats[-1], 8.35)
        if at is not None and _lone(world, chats[-1], at, rng):
            tick = at + TEN_MINUTES - timedelta(seconds=30)
            _add(world.destinations[chats[-1]], world, tick - timedelta(minutes=1),
                 1.75 / 60, "hang")
    return crashes


def _quiet(world: World, destination: str, day: float) -> datetime | None:
    """The first moment from ``day`` on, 30 s after a tick, at which ``destination``'s
    channel, its tenant's feed and the stores have no fault for hours (None: none before
    the span ends)."""
    channel = destination.split(":", 1)[0]
    rule = next((r for r in world.rules() if f"{r.channel}:{r.recipient}" == destination),
                None)
    if rule is None:
        return None
    tenant = next(t for t in world.tenants if t.scope == rule.scope)
    feed = world.feeds[tenant.feeds[0]]
    peers = [peer for name, peer in world.destinations.items()
             if name.startswith(f"{channel}:")]
    at = world.start + TEN_MINUTES * -(-timedelta(days=day) // TEN_MINUTES) \
        + timedelta(seconds=30)
    while at < _at(world, SPAN_DAYS):
        if (all(_clear(peer, at - timedelta(hours=2), at + timedelta(hours=4))
                for peer in peers)
                and _clear(feed, at - timedelta(days=2), at + timedelta(hours=4))
                and _clear(world.outages, at - timedelta(hours=2), at + timedelta(hours=4))
                and rule.keyword_at(at) is not None
                and not _held_disabled(world, destination, at)
                and rule.unchanged(at - timedelta(hours=1), at + timedelta(hours=4))
                and not _matches_near(world, rule.keyword_at(at), at)):
            return at
        at += TEN_MINUTES
    return None


def _held_disabled(world: World, destination: str, at: datetime) -> bool:
    """Whether Sluice may still hold ``destination`` disabled at ``at``: it refused in a
    window that began before then (a refusal disables its destination), and no operator
    visit came between that window's end and ``at`` (only the operator enables it again,
    at a visit once it answers): a story owed to it then would fail
    ``destination_disabled``, as it should."""
    peer = world.destinations.get(destination)
    if peer is None:
        return False
    return any(w.kind == "refuse" and w.start < at
               and not any(w.end <= visit < at for visit in world.operator_at)
               for w in peer.windows)


def _clear(peer: Peer, start: datetime, end: datetime) -> bool:
    return not any(w.start < end and start < w.end for w in peer.windows)


def _matches_near(world: World, keyword: str | None, at: datetime) -> bool:
    return any(keyword in story.words and abs(story.published - at) < timedelta(hours=1)
               for feed in world.feeds.values() for story in feed.stories)


def _lone(world: World, destination: str, at: datetime, rng: random.Random) -> bool:
    rule = next(r for r in world.rules() if f"{r.channel}:{r.recipient}" == destination)
    tenant = next(t for t in world.tenants if t.scope == rule.scope)
    keyword = rule.keyword_at(at)
    if keyword is None:
        return False
    feed: Feed = world.feeds[tenant.feeds[0]]
    number = max((s.number for f in world.feeds.values() for s in f.stories), default=0) + 1
    feed.stories.append(FeedStory(number, at, (keyword, *rng.sample(FILLER, 2))))
    feed.stories.sort(key=lambda s: (s.published, s.number))
    world.faults["lone_story"] = world.faults.get("lone_story", 0) + 1
    return True


def _sqs_throttled(world: World, seed: int) -> None:
    """From day 5.8, the first moment a tick's every tenant with an enabled destination can
    be owed a lone story (each tenant's feed, every destination of the channel of its first
    rule whose destination no refusal holds disabled, and the stores clear for hours, no
    story with the keyword near): SQS answers one send a minute for two hours around it
    (the tick's global message goes, each per-build message after it times out, so the
    tick builds them inline), and each such tenant gets a lone story on its first feed
    matched by that rule, owed to its destination by the tick after it (the
    key whose publish timed out included: ``built_in_its_tick``). From a generator of its
    own, after everything else, so the rest of the world is as it was."""
    rng = random.Random(f"limits-sqs-{seed}")
    at = world.start + TEN_MINUTES * -(-timedelta(days=5.8) // TEN_MINUTES) \
        + timedelta(seconds=30)
    feeds = [world.feeds[name] for tenant in world.tenants for name in tenant.feeds]
    while at < _at(world, SPAN_DAYS):
        rules = _enabled_rules(world, at)
        if rules and _owed_by_next_tick(world, rules, feeds, at):
            break
        at += TEN_MINUTES
    else:
        return
    world.sqs_throttled.append(Window(at - timedelta(hours=1), at + timedelta(hours=1),
                                      "sqs_throttled"))
    world.faults["sqs_throttled"] = world.faults.get("sqs_throttled", 0) + 1
    tick = at + TEN_MINUTES - timedelta(seconds=30)  # the first tick after the stories
    for rule in rules:
        destination = f"{rule.channel}:{rule.recipient}"
        if _lone(world, destination, at, rng):
            number = max(s.number for f in world.feeds.values() for s in f.stories)
            world.received_by[(number, destination)] = tick + PROMPT_MARGIN


def _enabled_rules(world: World, at: datetime) -> list[SimRule]:
    """Each tenant's first rule whose destination no earlier refusal still holds disabled at
    ``at`` (a tenant without one has none)."""
    found = []
    for tenant in world.tenants:
        rule = next((r for r in tenant.rules
                     if not _held_disabled(world, f"{r.channel}:{r.recipient}", at)), None)
        if rule is not None:
            found.append(rule)
    return found


def _notices(world: World) -> None:
    """Six hours before each erasure's grace window ends (one neither cancelled nor
    confirmed), the app sends the user a notification of its own (``sluice.enqueue_delivery``
    naming them in ``subject_user_id``; the alerts' entries name no user) to a chat that is
    clear around it, and the chat goes down right after, until four hours past the grace
    window's end (its entry's expiry, a day, still ahead): the entry waits through the
    purge, which must take it, so the chat never gets it when it is back
    (``nothing_comes_back``, engine). Not a chat a lone story is owed to then (its bound
    would not hold through the outage). Draws nothing."""
    chats = sorted(name for name in world.destinations if not name.startswith("webhook:"))
    published = {s.number: s.published for f in world.feeds.values() for s in f.stories}
    for n, erasure in enumerate(world.erasures):
        if erasure.cancel_at is not None or erasure.confirm_at is not None:
            continue
        ends = erasure.at + timedelta(days=erasure.grace_days)
        at = ends - timedelta(hours=6)
        if ends + timedelta(hours=6) >= world.end or at <= erasure.at:
            continue
        owed = {name for (number, name) in world.enqueued_by
                if at - timedelta(days=1) < published[number] < ends + timedelta(hours=6)}
        chat = next((name for name in chats if name not in owed
                     and _clear(world.destinations[name], at - timedelta(hours=2),
                                ends + timedelta(hours=6))), None)
        if chat is None:
            continue
        world.notices.append((at, erasure, chat, NOTICE_NUMBERS + n))
        world.faults["app_notice"] = world.faults.get("app_notice", 0) + 1
        _add(world.destinations[chat], world, at + timedelta(minutes=1), 10 - 1 / 60, "down")
