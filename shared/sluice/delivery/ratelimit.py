"""Per-destination send rates, shared by every concurrent sender.

Each entry maps to the rates it must respect (``rates_for``): Telegram's per-bot rate
and its per-chat one (a group, whose chat id is negative, has a per-minute one),
Slack's per channel, a webhook's per host; email has none. A rate is held as the next
moment one more message may go to its key, and messages are spaced evenly at the rate's
interval (no bursts; by default 5% wider than the limit's, the headroom that keeps network
jitter from turning an exact spacing into a provider's 429), so no window of the rate's
period ever holds more than its limit, plus the one on the window's closing edge,
whatever the number of senders. A slot taken late by at most the headroom keeps the next
one on schedule (``slack_us``): the senders' own delays (a wake-up, a round trip) do not
pile up into a slower rate, and no two messages are ever closer than the limit's own
interval.

``take`` is atomic across every key of the entry: either all have a slot now and all
advance, or none does and the caller learns how long to wait. The state lives in
Redis when configured (one Lua script), else in ``delivery_rate_limits`` (one
transaction, rows locked in key order). A 429 that names its wait and is retried in
process (``on_retry``) holds the entry's narrowest key (the chat, the channel, the host)
for every sender until the retry, whose slot it keeps; one that outlasts the in-process
retries moves that key to at least then (``slow_down``). Every other request of a send
after its first, a further chunk or an in-process retry, takes its own slot before it
leaves (``further``), after the retry's backoff: a receiver that fails every request
still gets them at its rate. What becomes of the entry (a
slot missing, a pacing answer, one past the cap) is the policy's
(``sluice.delivery.policy``); this module only holds the rates.

An operator may override a destination's own rate (its narrowest: the chat, the channel,
the host; for a destination without one, such as the SMTP server, a rate of its own) per
second or per minute until a time (``sluice delivery destination rate``). Every sender
reads the overrides in force from ``delivery_destinations`` (again after
``OVERRIDES_TTL_S``), spaces that key at the override's interval, and never past its end:
a slot taken under an override is never held beyond the override's time (then the
setting's rate applies again), so an override lapses at its time without an operator.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from sluice.core.times import iso_z_or_none
from sluice.delivery.classify import NoRateSlot
from sluice.delivery.keys import webhook_receiver
from sluice.delivery.policy import pacing_s
from sluice.delivery.store import DeliveryEntry
from sluice.store.db import Database, load_queries

if TYPE_CHECKING:
    from sluice.core.services import Services
    from sluice.core.settings import Settings

Q = load_queries("ratelimit")
US = 1_000_000
OVERRIDES_TTL_S = 5.0  # how long a sender trusts what it read of the operators' overrides
PERIODS_S: dict[str, int] = {"second": 1, "minute": 60}
Per = Literal["second", "minute"]


class Rate(NamedTuple):
    key: str
    interval_us: int  # the spacing between two messages to this key
    # How late a slot may be taken and still keep the next one on schedule (the headroom
    # over the limit's own interval): a sender a little late does not push every later
    # message back, and no two messages are ever closer than the limit's interval.
    slack_us: int = 0
    # An override's end (epoch microseconds; 0: none): no slot taken under it is held past
    # then, nor closer than ``floor_us`` (the setting's own interval) to the one taken now.
    cap_us: int = 0
    floor_us: int = 0

    @classmethod
    def per(cls, key: str, limit: float, period_s: float) -> Rate:
        return cls(key, math.ceil(period_s * US / limit))

    def next_at(self, at_us: int, now_us: int) -> int:
        """When the next slot on this key frees, once one is taken now (``at_us``: when
        this one was free)."""
        nxt = max(at_us, now_us - self.slack_us) + self.interval_us
        if self.cap_us:
            nxt = min(nxt, max(self.cap_us, now_us + self.floor_us))
        return nxt


class Override(NamedTuple):
    """An operator's rate for one destination, until a time."""

    key: str  # the destination's key
    limit: float
    per: Per
    until: datetime


class Limit(NamedTuple):
    """One rate an entry's send respects, as configured: ``limit`` a ``per``, from
    ``source`` (the setting's variable, or ``override``, then until ``until``)."""

    key: str  # the rate's own key (its state, shared by every sender)
    limit: float
    per: Per
    source: str
    until: datetime | None = None

    @property
    def period_s(self) -> int:
        return PERIODS_S[self.per]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "limit": self.limit, "per": self.per, "source": self.source,
                "until": iso_z_or_none(self.until)}


def rates_for(entry: DeliveryEntry, settings: Settings,
              override: Override | None = None) -> list[Rate]:
    """The rates an entry's send must respect, widest first (the last is the narrowest),
    each ``delivery_rate_headroom`` below its limit; with ``override``, its destination's
    own rate is the operator's until the override's end."""
    slower = 1.0 - settings.delivery_rate_headroom
    plain = {limit.key: limit for limit in limits_for(entry.channel, entry.recipient, settings)}
    rates = []
    for limit in limits_for(entry.channel, entry.recipient, settings, override):
        interval, slack = _spacing(limit, slower)
        rate = Rate(limit.key, interval, slack)
        if limit.until is not None:
            under = plain.get(limit.key)
            rate = rate._replace(cap_us=int(limit.until.timestamp() * US),
                                 floor_us=_spacing(under, slower)[0] if under else 0)
        rates.append(rate)
    return rates


def _spacing(limit: Limit, slower: float) -> tuple[int, int]:
    """(interval, slack): the limit's interval widened by the headroom, and by how much."""
    exact = math.ceil(limit.period_s * US / limit.limit)
    interval = math.ceil(exact / slower)
    return interval, interval - exact


def limits_for(channel: str, recipient: str, settings: Settings,
               override: Override | None = None) -> list[Limit]:
    """The limits of the rates a send to ``recipient`` on ``channel`` respects, as
    configured (widest first), with ``override`` in place of its destination's own (the
    last), or added when it has none."""
    found = _limits_for(channel, recipient, settings)
    if override is None:
        return found
    own = bool(found) and channel in OWN_RATE
    mine = Limit(found[-1].key if own else f"destination:{override.key}", override.limit,
                 override.per, "override", override.until)
    return [*found[:-1], mine] if own else [*found, mine]


# The channels whose narrowest rate is their destination's own (a chat, a channel, a host).
OWN_RATE = frozenset({"telegram", "slack", "webhook"})


def _limits_for(channel: str, recipient: str, settings: Settings) -> list[Limit]:
    if channel == "telegram":
        chat = recipient
        per_chat = (Limit(f"telegram:chat:{chat}", settings.telegram_group_rate_per_min,
                          "minute", "SLUICE_TELEGRAM_GROUP_RATE_PER_MINUTE")
                    if chat.startswith("-")
                    else Limit(f"telegram:chat:{chat}", settings.telegram_chat_rate_per_s,
                               "second", "SLUICE_TELEGRAM_CHAT_RATE_PER_SECOND"))
        return [Limit("telegram:bot", settings.telegram_rate_per_s, "second",
                      "SLUICE_TELEGRAM_RATE_PER_SECOND"), per_chat]
    if channel == "slack":
        return [Limit(f"slack:channel:{recipient}", settings.slack_channel_rate_per_s,
                      "second", "SLUICE_SLACK_CHANNEL_RATE_PER_SECOND")]
    if channel == "webhook":
        found = webhook_receiver(recipient)
        if found is None:  # unparseable: its send refuses it for good, and no host is reached
            return []
        return [Limit(f"webhook:host:{found}", settings.webhook_host_rate_per_s,
                      "second", "SLUICE_WEBHOOK_HOST_RATE_PER_SECOND")]
    return []


def read_overrides(db: Database, now: datetime) -> dict[str, Override]:
    """The operators' rate overrides in force at ``now``, per destination."""
    with db.transaction() as tx:
        rows = tx.fetchall(Q.rate_overrides, {"now": now})
    found = {}
    for row in rows:
        until = row["rate_until"]
        if isinstance(until, str):  # SQLite
            until = datetime.fromisoformat(until).astimezone(UTC)
        per: Per = "minute" if int(row["rate_period_s"]) == 60 else "second"
        found[row["key"]] = Override(row["key"], float(row["rate_limit"]), per, until)
    return found


class RateStore(Protocol):
    def take(self, rates: list[Rate], now_us: int) -> int:
        """0 when every key had a slot (all taken); else microseconds to wait (none taken)."""
        ...

    def slow(self, key: str, until_us: int) -> None:
        """No slot for ``key`` before ``until_us``."""
        ...


class RedisRates:
    # ARGV: now, then per key its interval, slack, cap and floor (Rate.next_at)
    TAKE = """
local now = tonumber(ARGV[1])
local n = #KEYS
local wait = 0
for i, key in ipairs(KEYS) do
  local at = tonumber(redis.call('GET', key) or '0')
  if at - now > wait then wait = at - now end
end
if wait > 0 then return wait end
for i, key in ipairs(KEYS) do
  local at = tonumber(redis.call('GET', key) or '0')
  local nxt = math.max(at, now - tonumber(ARGV[n + i + 1])) + tonumber(ARGV[i + 1])
  local cap = tonumber(ARGV[2 * n + i + 1])
  if cap > 0 then nxt = math.min(nxt, math.max(cap, now + tonumber(ARGV[3 * n + i + 1]))) end
  redis.call('SET', key, string.format('%.0f', nxt), 'PX',
             math.ceil((nxt - now) / 1000) + 60000)
end
return 0
"""
    SLOW = """
local at = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if want > at then
  redis.call('SET', KEYS[1], string.format('%.0f', want), 'PX',
             math.ceil((want - tonumber(ARGV[2])) / 1000) + 60000)
end
return 0
"""

    def __init__(self, redis: Any, *, now_us: Callable[[], int] | None = None) -> None:
        self.redis = redis
        self.now_us = now_us

    def take(self, rates: list[Rate], now_us: int) -> int:
        keys = [f"delivery:rate:{r.key}" for r in rates]
        return int(self.redis.eval(self.TAKE, keys, [
            now_us, *(r.interval_us for r in rates), *(r.slack_us for r in rates),
            *(r.cap_us for r in rates), *(r.floor_us for r in rates)]))

    def slow(self, key: str, until_us: int) -> None:
        now = self.now_us() if self.now_us else int(time.time() * US)
        self.redis.eval(self.SLOW, [f"delivery:rate:{key}"], [until_us, now])


class DbRates:
    def __init__(self, db: Database) -> None:
        self.db = db

    def take(self, rates: list[Rate], now_us: int) -> int:
        ordered = sorted(rates)
        with self.db.transaction() as tx:
            for rate in ordered:
                tx.execute(Q.rate_ensure, {"key": rate.key})
            found = {row["key"]: int(row["next_at_us"]) for row in tx.fetchall(
                Q.rate_lock, {"keys": tx.json([r.key for r in ordered])})}
            wait = max((found.get(r.key, 0) - now_us for r in ordered), default=0)
            if wait > 0:
                return wait
            for rate in ordered:
                tx.execute(Q.rate_set, {"key": rate.key,
                                        "next_at_us": rate.next_at(found.get(rate.key, 0), now_us)})
        return 0

    def slow(self, key: str, until_us: int) -> None:
        with self.db.transaction() as tx:
            tx.execute(Q.rate_slow, {"key": key, "until_us": until_us}, final=True)


class Limiter:
    """The drain's seam: ``acquire`` before each send, ``further`` before each request
    after a send's first, ``slow_down`` on a rate limit."""

    def __init__(self, store: RateStore, settings: Settings, *,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep,
                 overrides: Callable[[datetime], dict[str, Override]] | None = None) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.sleep = sleep
        self.max_wait_s = settings.delivery_rate_wait_s
        self.waited_s = 0.0
        self.slowed = 0
        self._local = threading.local()
        self.overrides = overrides  # the operators' rate overrides in force at a time
        self._overrides: dict[str, Override] = {}
        self._overrides_read: float | None = None
        self._overrides_lock = threading.Lock()

    @classmethod
    def from_services(cls, services: Services, **kwargs: Any) -> Limiter:
        settings = services.settings
        clock: Callable[[], float] = kwargs.get("clock", time.time)
        store: RateStore = (RedisRates(services.redis, now_us=lambda: int(clock() * US))
                            if settings.redis_configured else DbRates(services.db))
        db = services.db
        kwargs.setdefault("overrides", lambda now: read_overrides(db, now))
        return cls(store, settings, **kwargs)

    def _now_us(self) -> int:
        return int(self.clock() * US)

    def override(self, entry: DeliveryEntry) -> Override | None:
        """The operator's rate for ``entry``'s receiver (where its rate lives) in force now,
        else for its destination, if any."""
        if self.overrides is None or (entry.receiver is None and entry.destination is None):
            return None
        now = self.clock()
        with self._overrides_lock:
            if self._overrides_read is None or now - self._overrides_read > OVERRIDES_TTL_S:
                self._overrides = self.overrides(datetime.fromtimestamp(now, UTC))
                self._overrides_read = now
            found = next((self._overrides[key] for key in (entry.receiver, entry.destination)
                          if key is not None and key in self._overrides), None)
        return found if found is not None and found.until.timestamp() > now else None

    def rates(self, entry: DeliveryEntry) -> list[Rate]:
        return rates_for(entry, self.settings, self.override(entry))

    def acquire(self, entry: DeliveryEntry, *, time_left_s: float | None = None,
                chunk: bool = False) -> float:
        """Take a slot for ``entry`` on every rate it has, waiting for one up to the
        configured wait (and never past ``time_left_s``). 0 when taken; else the seconds
        until a slot frees, and the caller sets the entry aside until then.

        A ``chunk`` after the first of one send waits one interval of the entry's narrowest
        rate longer: the chunk before it has just taken that key's slot."""
        rates = self.rates(entry)
        if not rates:
            return 0.0
        wait_for = self.max_wait_s + (rates[-1].interval_us / US if chunk else 0.0)
        patience = wait_for if time_left_s is None else min(wait_for, max(0.0, time_left_s))
        waited = 0.0
        while True:
            wait_s = self.store.take(rates, self._now_us()) / US
            if wait_s <= 0:
                return 0.0
            if waited + wait_s > patience:
                return wait_s
            self.sleep(wait_s)
            waited += wait_s
            self.waited_s += wait_s

    def slow_down(self, entry: DeliveryEntry, wait_s: float, *, keep_first: bool = False) -> None:
        """A provider refused for its rate: no slot for the entry's narrowest key for
        ``wait_s`` (at least one interval of that key); ``keep_first`` holds one interval
        more, the first slot after the wait kept for the send that retries then."""
        rates = self.rates(entry)
        if not rates:
            return
        narrowest = rates[-1]
        until = self._now_us() + max(int(wait_s * US), narrowest.interval_us) + (
            narrowest.interval_us if keep_first else 0)
        self.store.slow(narrowest.key, until)
        self.slowed += 1

    @contextmanager
    def sending(self, entry: DeliveryEntry,
                time_left: Callable[[], float] | None = None) -> Iterator[None]:
        """While ``entry`` is being sent by this thread (its in-process retries included);
        ``time_left()`` bounds a further request's wait for its slot (``further``)."""
        self._local.entry = entry
        self._local.time_left = time_left
        self._local.kept = False
        try:
            yield
        finally:
            self._local.entry = None
            self._local.time_left = None
            self._local.kept = False

    def further(self, what: str) -> None:
        """A request of the send being made (``sending``) after its first (a further
        chunk, a retry) takes its own slot before it leaves, waiting for it like a ``chunk``
        within the send's time left; none in time ends the send with ``NoRateSlot``. A
        retry after a 429 that named its wait goes in the slot ``on_retry`` kept for it."""
        entry = getattr(self._local, "entry", None)
        if entry is None:
            return
        if self._local.kept:
            self._local.kept = False
            return
        time_left = self._local.time_left
        wait_s = self.acquire(entry, time_left_s=time_left() if time_left else None,
                              chunk=True)
        if wait_s > 0:
            raise NoRateSlot(f"not sent yet: {entry.channel} rate limit ({what})",
                             retry_after_s=wait_s)

    def on_retry(self, error: BaseException, attempt: int, wait_s: float) -> None:
        """The send being made (``sending``) is about to wait ``wait_s`` in process and try
        again after a 429 that named its wait: every sender holds off that key until then,
        the first slot after it kept for this retry, so the others neither pile more
        refusals on the provider meanwhile nor collide with the retry."""
        entry = getattr(self._local, "entry", None)
        asked = pacing_s(error)
        if entry is not None and asked is not None and asked > 0:
            self.slow_down(entry, wait_s, keep_first=True)
            self._local.kept = True


__all__ = ["DbRates", "Limit", "Limiter", "Override", "Rate", "RateStore", "RedisRates",
           "limits_for", "rates_for", "read_overrides"]
