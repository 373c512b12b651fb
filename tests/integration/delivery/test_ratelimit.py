"""Delivery at the providers' rates: the limiter shared by concurrent senders (SQLite,
Postgres, Redis) never lets more than one extra message into any window of a rate's
period; a 429 slows every sender there and never burns an attempt; concurrent drains
never send an entry twice."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest

from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.delivery.channels import Outbound
from sluice.delivery.classify import NoRateSlot, TransientDeliveryError
from sluice.delivery.drain import Deliverer, SendOutcome
from sluice.delivery.ratelimit import US, DbRates, Limiter, Rate, RateStore, RedisRates, rates_for
from sluice.delivery.store import DeliveryEntry, DeliveryStatus, DeliveryStore
from sluice.jobs.registry import Deadline
from sluice.store.db import utcnow
from tests.integration.delivery.helpers import Providers, drain_once

GROUP = "-100200"


class Recorded:
    """A rate store that notes every slot it grants, per key (the invariant's input)."""

    def __init__(self, inner: RateStore) -> None:
        self.inner = inner
        self.granted: dict[str, list[int]] = {}
        self.lock = threading.Lock()

    def take(self, rates: list[Rate], now_us: int) -> int:
        wait = self.inner.take(rates, now_us)
        if wait == 0:
            with self.lock:
                for rate in rates:
                    self.granted.setdefault(rate.key, []).append(now_us)
        return wait

    def slow(self, key: str, until_us: int) -> None:
        self.inner.slow(key, until_us)


class SharedClock:
    """Time that moves only when a sender sleeps (every sender shares it)."""

    def __init__(self) -> None:
        self.t = 1_800_000_000.0
        self.lock = threading.Lock()

    def now(self) -> float:
        with self.lock:
            return self.t

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.t += seconds


def most_in_any_window(moments: list[int], window_us: int) -> int:
    moments = sorted(moments)
    best = start = 0
    for end, at in enumerate(moments):
        while at - moments[start] >= window_us:
            start += 1
        best = max(best, end - start + 1)
    return best


def entry(channel: str, recipient: str) -> DeliveryEntry:
    now = utcnow()
    return DeliveryEntry("e", channel, recipient, None, {"text": "x"}, None,
                         DeliveryStatus.IN_FLIGHT, 1, now, now, None, None, None, now, now,
                         None, None)


def test_the_rates_of_each_channel_come_from_the_settings() -> None:
    settings = Settings.from_env({"SLUICE_DELIVERY_RATE_HEADROOM": "0"})
    assert rates_for(entry("telegram", "1001"), settings) == [
        Rate("telegram:bot", 33_334), Rate("telegram:chat:1001", US)]
    assert rates_for(entry("telegram", GROUP), settings)[1] == Rate(f"telegram:chat:{GROUP}",
                                                                   3 * US)
    assert rates_for(entry("slack", "C1"), settings) == [Rate("slack:channel:C1", US)]
    assert rates_for(entry("webhook", "https://hooks.example:8443/a"), settings) == [
        Rate("webhook:host:hooks.example:8443", 100_000)]
    assert rates_for(entry("email", "a@example.com"), settings) == []
    custom = Settings.from_env({"SLUICE_TELEGRAM_GROUP_RATE_PER_MINUTE": "30",
                                "SLUICE_DELIVERY_RATE_HEADROOM": "0"})
    assert rates_for(entry("telegram", GROUP), custom)[1].interval_us == 2 * US


def test_sends_are_spaced_with_the_headroom_below_each_limit() -> None:
    default = Settings.from_env({})  # 5% below: 10/s to a host becomes one per 105.3 ms
    assert rates_for(entry("webhook", "https://hooks.example/a"), default) == [
        Rate("webhook:host:hooks.example:443", 105_264, 5_264)]
    wide = Settings.from_env({"SLUICE_DELIVERY_RATE_HEADROOM": "0.5"})
    assert rates_for(entry("slack", "C1"), wide) == [Rate("slack:channel:C1", 2 * US, US)]


def test_a_slot_taken_a_little_late_keeps_the_next_on_schedule_never_closer_than_the_limit(
        db_url: str, make_services: Callable[..., Services]) -> None:
    """10 a second with 5% headroom: one per 105.264 ms. A sender that always wakes 3 ms
    late keeps that schedule (its delays do not add up); one 50 ms late moves it, by what
    is past the headroom; two grants are never closer than the limit's own 100 ms."""
    clock = SharedClock()
    limiter = Limiter(DbRates(make_services(db_url).db), Settings.from_env({}),
                      clock=clock.now, sleep=clock.sleep)
    limiter.max_wait_s = 0.0  # report the wait instead of sleeping it
    hook = entry("webhook", "https://hooks.example/a")
    grants = []
    for _ in range(20):
        wait = limiter.acquire(hook)
        if wait > 0:
            clock.sleep(wait + 0.003)
            assert limiter.acquire(hook) == 0.0
        grants.append(clock.now())
    assert min(b - a for a, b in itertools.pairwise(grants)) >= 0.1 - 1e-6
    assert grants[-1] - grants[1] == pytest.approx(18 * 0.105264, abs=1e-4), "on schedule"
    clock.sleep(limiter.acquire(hook) + 0.050)
    assert limiter.acquire(hook) == 0.0
    assert limiter.acquire(hook) == pytest.approx(0.1, abs=1e-5), "the limit's interval on"


def test_concurrent_senders_never_exceed_a_rate_by_more_than_one_db(
        db_url: str, make_services: Callable[..., Services]) -> None:
    exercise(DbRates(make_services(db_url).db))


def test_concurrent_senders_never_exceed_a_rate_by_more_than_one_redis(
        sqlite_url: str, redis_env: dict[str, str],
        make_services: Callable[..., Services]) -> None:
    exercise(RedisRates(make_services(sqlite_url, **redis_env).redis))


def exercise(inner: RateStore) -> None:
    """Four senders, 60 messages over six chats, on one clock that moves when they wait."""
    recorded = Recorded(inner)
    clock = SharedClock()
    settings = Settings.from_env({"SLUICE_TELEGRAM_RATE_PER_SECOND": "20",
                                  "SLUICE_TELEGRAM_CHAT_RATE_PER_SECOND": "5"})
    chats = ["1001", "1002", "1003", "1004", "1005", "1006"]
    errors: list[BaseException] = []

    def sender(n: int) -> None:
        limiter = Limiter(recorded, settings, clock=clock.now, sleep=clock.sleep)
        try:
            for i in range(15):
                while limiter.acquire(entry("telegram", chats[(n + i) % len(chats)])) > 0:
                    clock.sleep(0.01)  # set aside: this sender comes back to it later
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    bot = recorded.granted["telegram:bot"]
    assert len(bot) == 60, "every message got its slot"
    assert most_in_any_window(bot, US) <= 20 + 1
    for chat in chats:
        assert most_in_any_window(recorded.granted[f"telegram:chat:{chat}"], US) <= 5 + 1
    spaced = sorted(bot)  # the bot's rate spaces every grant by its interval
    assert min(b - a for a, b in itertools.pairwise(spaced)) >= 50_000


def test_a_429_slows_that_chat_for_every_sender_and_burns_no_attempt(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    # a wait past the rate wait (never slept in a send) and past a run's budget (no run
    # idles for it): one request, then nothing to that chat until the wait has passed
    providers.telegram.flood_wait.append(60)
    first, _ = store.enqueue("telegram", "1001", {"text": "one"})

    result = drain_once(svc)

    assert result["rateLimited"] == 1 and result["skippedMaxRetries"] == 0
    stored = store.get(first.id)
    assert stored.status is DeliveryStatus.PENDING and stored.attempts == 0
    assert "rate limited" in (stored.last_error or "")
    assert (stored.next_attempt_at - utcnow()).total_seconds() > 55
    sent = len(providers.telegram.http.requests)
    # another run, another entry to the same chat: not even claimed before the chat's wait
    second, _ = store.enqueue("telegram", "1001", {"text": "two"})
    again = drain_once(svc)
    assert again["rateLimited"] == 0 and again["recovered"] == 0
    assert store.get(second.id).attempts == 0
    # another sender (inline, outside any drain): the chat's shared rate key holds it back
    with Outbound.open(svc.settings, deadline_s=20) as client:
        _, inline = Deliverer.from_services(svc, client).deliver("telegram", "1001",
                                                                 {"text": "inline"})
    assert inline is SendOutcome.RATE_LIMITED
    assert providers.telegram.messages == [] and len(providers.telegram.http.requests) == sent
    # a different chat is not slowed
    providers.telegram.chats.add("1003")
    other, _ = store.enqueue("telegram", "1003", {"text": "three"})
    assert drain_once(svc)["recovered"] == 1
    assert store.get(other.id).status is DeliveryStatus.ACKED


def test_concurrent_drains_send_every_entry_exactly_once(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    ids = [store.enqueue("webhook", providers.webhook.url, {"text": f"n{n}"})[0].id
           for n in range(40)]
    errors: list[BaseException] = []

    def drain() -> None:
        try:
            with Outbound.open(svc.settings, deadline_s=60) as client:
                Deliverer.from_services(svc, client).drain(Deadline(60))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    keys = [r["key"] for r in providers.webhook.received]
    assert sorted(keys) == sorted(ids), "each entry sent once, none lost"
    assert {store.get(i).status for i in ids} == {DeliveryStatus.ACKED}
    assert {store.get(i).attempts for i in ids} == {1}
    assert store.claim(timedelta(seconds=30)) == []


def test_a_429_retried_in_process_holds_its_key_for_every_sender_until_the_retry(
        db_url: str, make_services: Callable[..., Services]) -> None:
    """The sender that got the 429 waits 2 s in process: meanwhile no other sender gets a
    slot on that chat, and the first slot after the wait is the retry's (one interval on)."""
    clock = SharedClock()
    settings = Settings.from_env({"SLUICE_DELIVERY_RATE_HEADROOM": "0"})
    rates = DbRates(make_services(db_url).db)
    retrying = Limiter(rates, settings, clock=clock.now, sleep=clock.sleep)
    other = Limiter(rates, settings, clock=clock.now, sleep=clock.sleep)
    other.max_wait_s = 0.0  # report the wait instead of sleeping it
    chat, elsewhere = entry("telegram", "1001"), entry("telegram", "1002")
    assert retrying.acquire(chat) == 0.0

    refused = TransientDeliveryError("telegram answered 429", retry_after_s=2, status=429)
    with retrying.sending(chat):
        retrying.on_retry(refused, 1, 2.0)
    clock.sleep(0.05)  # past the bot's own interval (1/30 s)
    assert other.acquire(chat) == pytest.approx(2.95, abs=0.01), \
        "the wait, then the retry's slot"
    assert other.acquire(elsewhere) == 0.0, "another chat is not held"
    # outside a send (no entry), or an error that is no rate limit, holds nothing
    other.on_retry(refused, 1, 2.0)
    with retrying.sending(elsewhere):
        retrying.on_retry(TransientDeliveryError("503", status=503), 1, 0.3)
    clock.sleep(1.0)
    assert other.acquire(entry("telegram", "1002")) == 0.0


class RatesDown:
    """The rates' store unreachable (Redis down), as its client reports it."""

    def take(self, rates: list[Rate], now_us: int) -> int:
        from sluice.core.errors import TransientStoreError

        raise TransientStoreError("redis: connection refused")

    def slow(self, key: str, until_us: int) -> None:
        self.take([], 0)


def test_the_rates_store_down_before_a_send_costs_no_attempt_and_no_unknown_outcome(
        svc: Services, providers: Providers) -> None:
    """Found by the simulator (seed 2, day 15.7): a drain whose limiter's Redis was down
    left its claimed entry to lapse, so two outages made a message never sent rest
    ``unknown``. Nothing was sent: the entry goes back with its attempt."""
    from sluice.jobs.registry import get_job

    store = DeliveryStore(svc.db)
    providers.telegram.chats.add("1001")
    entry, _ = store.enqueue("telegram", "1001", {"text": "one"})
    for _ in range(3):
        with Outbound.open(svc.settings, deadline_s=60) as client:
            result = Deliverer.from_services(
                svc, client, limiter=Limiter(RatesDown(), svc.settings)).drain(Deadline(60))
        # the run stops and says so (a failure of the run, which pages), the entry uncharged
        assert result["notSent"] == 1 and "connection refused" in (result["notSentError"] or "")
        assert get_job("delivery-drain").failures(result) == 1
        stored = store.get(entry.id)
        assert stored.status is DeliveryStatus.PENDING and stored.attempts == 0
        assert stored.unknown_sends == 0 and "rate limits' store" in (stored.last_error or "")
    assert providers.telegram.messages == []
    assert drain_once(svc)["recovered"] == 1  # Redis back: sent once
    assert [m["text"] for m in providers.telegram.messages] == ["one"]


def test_a_run_waiting_for_a_slot_goes_on_though_its_wait_ends_a_moment_early(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    # GIVEN a group allowed one message a second, with a backlog, and a run whose wait for
    # the next slot ends a fraction of a millisecond before it by the clock the claim reads
    # (a timer's own clock and granularity may)
    svc = make_services(db_url, **providers.env(), SLUICE_TELEGRAM_GROUP_RATE_PER_MINUTE="60")
    providers.telegram.chats.add(GROUP)
    store = DeliveryStore(svc.db)
    for n in range(20):
        store.enqueue("telegram", GROUP, {"text": f"backlog {n}"})

    def early(seconds: float) -> None:
        time.sleep(max(0.0, seconds - 0.0003))

    # WHEN one run has about 4 s to send in (its last send's 5 s timeout must fit)
    with Outbound.open(svc.settings, deadline_s=20) as client:
        deadline = Deadline(9.0)
        deliverer = Deliverer.from_services(svc, client, deadline=deadline)
        deliverer.idle = early
        result = deliverer.drain(deadline)

    # THEN it claims again at each slot until its budget ends, not only up to the first
    # slot it waited for: one message a second
    assert result["recovered"] >= 3, result
    assert len(providers.telegram.messages) == result["recovered"]
    assert {e.attempts for e in store.list(status=DeliveryStatus.PENDING)} == {0}


def test_an_in_process_retry_takes_a_rate_slot_like_any_other_request(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    """Found by the simulator: a channel answering 500 to every request got a send and its
    two retries within one second, against its limit of one a second."""
    # GIVEN a webhook host allowed one request a second that answers 500 twice, then 200
    svc = make_services(db_url, **providers.env(), SLUICE_WEBHOOK_HOST_RATE_PER_SECOND="1")
    providers.webhook.answers += [500, 500]
    sent, _ = DeliveryStore(svc.db).enqueue("webhook", providers.webhook.url, {"text": "one"})

    # WHEN a drain sends it, retrying in process (its backoff recorded, not slept)
    result = drain_once(svc)

    # THEN it is delivered by its third request, each retry after a slot of its own
    assert result["recovered"] == 1, result
    assert DeliveryStore(svc.db).get(sent.id).attempts == 1
    arrivals = [int(r["at"] * US) for r in providers.webhook.received]
    assert len(arrivals) == 3
    assert most_in_any_window(arrivals, US) <= 1 + 1, "the rate's bound: its limit, plus one"
    assert min(b - a for a, b in itertools.pairwise(arrivals)) > US // 2, "no burst"


def test_a_retry_without_a_slot_in_the_runs_time_is_not_made_and_the_send_ends_with_its_answer(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    # GIVEN a host allowed one request a second that answers 500, and a run with half a
    # second left past one send's timeout (5 s)
    svc = make_services(db_url, **providers.env(), SLUICE_WEBHOOK_HOST_RATE_PER_SECOND="1")
    providers.webhook.answers.append(500)
    store = DeliveryStore(svc.db)
    sent, _ = store.enqueue("webhook", providers.webhook.url, {"text": "one"})

    # WHEN the run sends it: its retry's slot is a second away
    with Outbound.open(svc.settings, deadline_s=20) as client:
        deadline = Deadline(5.5)
        deliverer = Deliverer.from_services(svc, client, deadline=deadline)
        deliverer.idle = lambda seconds: None
        result = deliverer.drain(deadline)

    # THEN the retry never left, and the send ended with the 500 it had: the entry's own
    # transient failure, counted and scheduled (a retry that could not be made does not
    # turn an answered failure into a wait for a slot, so a failing receiver's schedule holds)
    assert len(providers.webhook.received) == 1
    assert result["recovered"] == 0 and result["rateLimited"] == 0, result
    stored = store.get(sent.id)
    assert stored.status is DeliveryStatus.PENDING and stored.attempts == 1
    assert "500" in (stored.last_error or "")
    assert stored.next_attempt_at is not None and stored.next_attempt_at > utcnow()


def test_a_retry_after_a_named_429_goes_in_the_slot_kept_for_it(
        db_url: str, make_services: Callable[..., Services]) -> None:
    clock = SharedClock()
    settings = Settings.from_env({"SLUICE_DELIVERY_RATE_HEADROOM": "0"})
    rates = DbRates(make_services(db_url).db)
    retrying = Limiter(rates, settings, clock=clock.now, sleep=clock.sleep)
    other = Limiter(rates, settings, clock=clock.now, sleep=clock.sleep)
    other.max_wait_s = 0.0  # report the wait instead of sleeping it
    chat = entry("slack", "C1")
    assert retrying.acquire(chat) == 0.0
    refused = TransientDeliveryError("slack answered 429", retry_after_s=2, status=429)
    with retrying.sending(chat, lambda: 0.0):
        retrying.on_retry(refused, 1, 2.0)
        clock.sleep(2.0)
        retrying.further("retry")  # the kept slot: nothing taken, no wait
        assert clock.now() == 1_800_000_002.0
        assert other.acquire(chat) == pytest.approx(1.0), "the kept slot is the retry's"
        with pytest.raises(NoRateSlot):  # the next retry takes its own, and has no time
            retrying.further("retry")
