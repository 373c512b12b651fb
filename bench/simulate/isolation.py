"""Delivery in production shapes (``--limits``): one entry, one URL, one chat or one operator
action must never hold back another destination.

From ``random.Random("limits-isolation-<seed>")``, after everything else ``--limits`` draws
(the rest of the world is as it was), at a moment on day ``DAY`` or after with the stores
clear for ``CLEAR`` (``plan``), an app enqueues through ``sluice.enqueue_delivery``:

- ``BACKLOG`` messages to one Telegram group (20 a minute): an alert storm;
- beside it, ``QUIET_EACH`` messages to each quiet destination (two private chats, two
  Slack channels, a webhook receiver of its own) at the start and every ``WAVE`` after,
  ``WAVES`` times; the first message of each wave to one chat and one Slack channel is long
  enough to be sent in chunks (the chat's with an idempotency key, the channel's without);
- ``QUIET_EACH`` messages to each of four URLs on one webhook host (``hosts.SHARED``), one
  URL answering ``410 Gone`` for hours: only that URL is gone;
- four messages to one receiver that answers 500 to the first of them only (a poison
  entry): the three others are the receiver's to take at once.

Operator actions land in the middle of a drain run (the receivers' request handler calls
them, between two sends of one run; ``TRIGGERS``): the group paused while its backlog is
being sent, later resumed; a chat the operator disabled before the wave (its entries failed
``destination_disabled``) enabled and its entries redriven; a chat's delivered window
replayed. Each falls back to its own moment when no request comes.

``fair_share`` (judged from the receivers' own records): every message to a destination
whose own state is clear is received within the fairness bound from when it became due (its
enqueue, or the operator's resume, redrive or replay): one drain interval, plus its own rate
spacing for each message due before it to the same rate key, plus ``SLACK`` for the run's
own waits. A crash of a drain run in between adds one drain interval (what that run had not
claimed waits for the next), and its lease for an entry the run held claimed unsent or had
just sent (``charges.py``: its claim waits for the lapse); a store outage in between excuses
the check. ``resumed``: after a resume (or a pause's end) the
group's backlog is asked again within the bound. Chunks: a chunked message's receiver
has every part of it (``chunks_whole``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from bench.simulate.peers import Peer, Window

DAY = 8.8
CLEAR = timedelta(hours=4)
BACKLOG = 2000
QUIET_EACH = 2
WAVE = timedelta(minutes=10)
WAVES = 4
DRAIN_EVERY = timedelta(minutes=1)  # serverless.yml: delivery-drain's rate
SLACK = timedelta(seconds=30)  # a run's own waits (the limiter's, in-process retries)
LEASE = timedelta(seconds=120)  # SLUICE_DELIVERY_LEASE_SECONDS' default
NUMBERS = 2_000_000  # the app's marker numbers here, above every story's and notice's
PARTS = 4  # paragraphs of a chunked message (two chunks of two)
PART_FILL = 1500

GROUP = "telegram:-1009001"
QUIET = ("telegram:9001", "telegram:9002", "slack:C90", "slack:C91", "webhook:hook-7-0")
CHUNKED = {"telegram:9001": True, "slack:C90": False}  # destination -> with a key
SHARED_URLS = tuple(f"webhook:hook-9-{r}" for r in range(4))
GONE_URL = SHARED_URLS[-1]
POISONED = "webhook:hook-8-0"  # the poison first: its destination not yet seen healthy
# three good ones first, then a poison (its failures its own: the destination is healthy)
# and an entry the receiver refuses for good (422: that entry, not the receiver, is wrong)
POISONED_LATE = "webhook:hook-8-1"
STALE = "webhook:hook-8-2"  # down past SLUICE_DESTINATION_DISABLE_AFTER (5 days)
STALE_FOR = timedelta(days=5, hours=12)
STALE_EVERY = timedelta(hours=12)  # a message to it on this rhythm, so it is probed
EMAIL = "email:ops@example.com"  # a channel with no adapter configured: held, then expired
LONG_PACED = "telegram:9005"  # answers 429 asking for longer than the pacing cap
UNKNOWN_SENT_AGAIN = "telegram:9006"  # its sender dies right after each of two sends
UNKNOWN_MARKED = "telegram:9008"  # the same; the operator marks it delivered
LAPSED = "telegram:9007"  # its sender dies right after each of five claims
OOM = "telegram:9001"  # its second wave's first send runs out of memory once
DISABLED = "telegram:9003"  # the operator disables it before the wave, enables mid-run
REPLAYED = "telegram:9004"  # delivered in the first wave, replayed mid-run
# (action, destination, the request that triggers it, not before, fallback after)
TRIGGERS = (("pause", GROUP, GROUP, timedelta(minutes=5), timedelta(minutes=8)),
            ("enable", DISABLED, "telegram:9001", timedelta(minutes=10),
             timedelta(minutes=14)),
            ("replay", REPLAYED, "telegram:9002", timedelta(minutes=20),
             timedelta(minutes=24)),
            ("resume", GROUP, "webhook:hook-7-0", timedelta(minutes=30),
             timedelta(minutes=34)))
PAUSE_FOR = timedelta(minutes=40)
HUNG_AFTER = CLEAR + timedelta(minutes=30)  # the store stops answering then, for HUNG_FOR
HUNG_FOR = timedelta(minutes=10)
PROBES = (1, 4, 7)  # minutes into it: an app enqueues (a request path's call)


def rate_key(destination: str) -> tuple[str, timedelta]:
    """The rate key a message counts against, and its interval (sluice's defaults)."""
    channel, recipient = destination.split(":", 1)
    if channel == "webhook":
        from bench.simulate.hosts import hook_host

        return f"webhook:{hook_host(recipient)}", timedelta(milliseconds=100)
    if channel == "telegram" and recipient.startswith("-"):
        return destination, timedelta(seconds=3)
    return destination, timedelta(seconds=1)


@dataclass
class Message:
    number: int
    destination: str
    at: datetime  # when the app enqueues it
    key: str | None
    text: str
    parts: int = 1


@dataclass
class Plan:
    start: datetime
    messages: list[Message] = field(default_factory=list)
    poison: set[int] = field(default_factory=set)
    rejected: set[int] = field(default_factory=set)
    oom: int = -1
    probes: list[datetime] = field(default_factory=list)


def plan(world: Any, seed: int) -> None:
    """Add the isolation world to ``world`` (``world.isolation``), or nothing when no
    moment from ``DAY`` on has the stores clear before the run ends."""
    rng = random.Random(f"limits-isolation-{seed}")
    at = world.start + DRAIN_EVERY * -(-timedelta(days=DAY) // DRAIN_EVERY) \
        + timedelta(seconds=30)
    while at + CLEAR < world.end:
        if not any(w.start < at + CLEAR and at - timedelta(hours=1) < w.end
                   for w in world.outages.windows):
            break
        at += timedelta(minutes=10)
    else:
        return
    found = Plan(at)
    numbers = iter(range(NUMBERS, NUMBERS + 100_000))

    def add(destination: str, when: datetime, key: bool, parts: int = 1) -> None:
        number = next(numbers)
        if parts > 1:
            fill = " ".join(rng.choice(("market", "energy", "data")) for _ in range(PART_FILL // 7))
            text = "\n\n".join(f"story-{number} [part {k} of {parts}] {fill}"
                               for k in range(1, parts + 1))
        else:
            text = f"story-{number}: an alert"
        found.messages.append(Message(number, destination, when,
                                      f"iso-{number}" if key else None, text, parts))

    for _ in range(BACKLOG):
        add(GROUP, at, True)
    for wave in range(WAVES):
        when = at + wave * WAVE
        for destination in QUIET:
            for n in range(QUIET_EACH):
                chunked = n == 0 and destination in CHUNKED
                add(destination, when, CHUNKED.get(destination, True) if chunked
                    else rng.random() < 0.5, PARTS if chunked else 1)
    for destination in (*SHARED_URLS, DISABLED, REPLAYED):
        for _ in range(QUIET_EACH):
            add(destination, at, True)
    for n in range(4):
        add(POISONED, at + timedelta(seconds=n), True)
        if n == 0:
            found.poison.add(found.messages[-1].number)
    for n in range(5):
        add(POISONED_LATE, at + timedelta(seconds=n), True)
        if n == 3:
            found.poison.add(found.messages[-1].number)
        elif n == 4:
            found.rejected.add(found.messages[-1].number)
    for n in range(int(STALE_FOR / STALE_EVERY) + 1):
        add(STALE, at + n * STALE_EVERY, True)
    for destination in (EMAIL, LONG_PACED, UNKNOWN_SENT_AGAIN, UNKNOWN_MARKED, LAPSED):
        add(destination, at, True)
    found.oom = next(m.number for m in found.messages
                     if m.destination == OOM and m.at == at + WAVE)
    world.poison = {(*m.destination.split(":", 1), m.number) for m in found.messages
                    if m.number in found.poison}
    world.rejected = {(*m.destination.split(":", 1), m.number) for m in found.messages
                      if m.number in found.rejected}
    world.oom = {(*OOM.split(":", 1), found.oom)}
    for name in (GROUP, *QUIET, *SHARED_URLS, POISONED, POISONED_LATE, STALE, DISABLED,
                 REPLAYED, LONG_PACED, UNKNOWN_SENT_AGAIN, UNKNOWN_MARKED, LAPSED):
        world.destinations.setdefault(name, Peer(name))
    world.destinations[STALE].windows.append(Window(at - timedelta(minutes=1),
                                                    at + STALE_FOR, "down"))
    world.destinations[LONG_PACED].windows.append(Window(at - timedelta(minutes=1),
                                                         at + timedelta(hours=2, minutes=30),
                                                         "ratelimit_long"))
    _hung(world, found, at + HUNG_AFTER)
    world.isolation_crashes = [
        *((at, f"delivery.after_send@{UNKNOWN_SENT_AGAIN}") for _ in range(2)),
        *((at, f"delivery.after_send@{UNKNOWN_MARKED}") for _ in range(2)),
        *((at, f"delivery.after_claim@{LAPSED}") for _ in range(5))]
    gone = world.destinations[GONE_URL]
    gone.windows.append(Window(at - timedelta(minutes=1), at + timedelta(hours=3), "refuse"))
    world.faults["isolation"] = 1
    world.faults["backlog"] = BACKLOG
    world.faults["gone_url"] = world.faults["poison_entry"] = 1
    world.isolation = found


def _hung(world: Any, found: Plan, at: datetime) -> None:
    """The store stops answering (a partition: ``outages.py``) for ``HUNG_FOR``, at the
    first moment from ``at`` that no AI call or erasure request (unbounded calls: they
    would wait the partition out inside one step) falls within a minute of it; an app's
    enqueue at each of ``PROBES`` minutes must give up within its request path's bound
    (``request_path_kept``)."""
    margin = timedelta(minutes=1)
    busy = [c.at for c in world.usage] + [e.at for e in world.erasures]
    while any(at - margin <= t < at + HUNG_FOR + margin for t in busy):
        at += timedelta(minutes=10)
    if at + HUNG_FOR + timedelta(hours=1) >= world.end:
        return
    window = Window(at, at + HUNG_FOR, "store_down")
    world.outages.windows.append(window)
    world.outages.windows.sort()
    world.hung.add(window)
    world.faults["store_hung"] = 1
    found.probes = [at + timedelta(minutes=m) for m in PROBES]
