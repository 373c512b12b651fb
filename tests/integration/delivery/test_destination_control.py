"""An operator's flow control of a destination, judged from what the stand-ins received
and the slots the shared rates granted: a pause sends nothing and expires nothing until its
time, then everything goes out once, in order, within the rates; a rate override is
honoured by every concurrent sender and lapses at its time. Both backends (and Redis for
the rates), real stand-ins."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.core.times import iso_z
from sluice.delivery import drain as drain_module
from sluice.delivery.channels import Outbound
from sluice.delivery.destinations import Destinations
from sluice.delivery.drain import Deliverer
from sluice.delivery.ratelimit import US, DbRates, Limiter, RateStore, RedisRates, read_overrides
from sluice.delivery.store import DeliveryEntry, DeliveryStatus, DeliveryStore
from sluice.jobs.registry import Deadline
from sluice.ops.destinations import apply, parse_change
from sluice.store.db import Database, utcnow
from tests.integration.delivery.helpers import Providers, drain_once
from tests.integration.delivery.test_ratelimit import Recorded, entry, most_in_any_window


def hook_key(providers: Providers) -> str:
    return f"webhook:127.0.0.1:{providers.webhook.url.split(':')[2].split('/')[0]}"


def backdate(svc: Services, entries: list[DeliveryEntry], hours: float) -> None:
    """Time travel: each entry was enqueued ``hours`` earlier (their order kept)."""
    with svc.db.transaction() as tx:
        for found in entries:
            tx.execute("UPDATE delivery_queue SET enqueued_at = :then WHERE id = :id",
                       {"then": found.enqueued_at - timedelta(hours=hours), "id": found.id})


def test_a_pause_sends_and_expires_nothing_until_its_time_then_all_go_once_in_order_in_rate(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    # GIVEN a webhook host limited to 2 a second, one alert delivered to it
    svc = make_services(db_url, **providers.env(), SLUICE_WEBHOOK_HOST_RATE_PER_SECOND="2")
    store, key = DeliveryStore(svc.db), hook_key(providers)
    store.enqueue("webhook", providers.webhook.url, {"text": "before"})
    drain_once(svc)
    waiting = [store.enqueue("webhook", providers.webhook.url, {"text": "old"})[0]]

    # WHEN an operator pauses it for two hours, and six more alerts come meanwhile
    until = utcnow() + timedelta(hours=2)
    paused = apply(svc, parse_change("pause", key, {"until": iso_z(until)}))
    assert paused["moved"] == 1, "the entry waiting for it is counted, claimed or not"
    waiting += [store.enqueue("webhook", providers.webhook.url, {"text": f"n{n}"})[0]
                for n in range(6)]
    first = drain_once(svc)

    # THEN nothing is sent, nothing is counted, and nothing expires though a day passes:
    # all seven wait on the paused key (its state row alone holds them; none is moved)
    assert first["paused"] == 7 and first["recovered"] == 0
    backdate(svc, waiting, 30)
    second = drain_once(svc)
    assert second["expired"] == 0 and second["recovered"] == 0 and second["paused"] == 7
    assert len(providers.webhook.received) == 1
    for held in waiting:
        stored = store.get(held.id)
        assert (stored.status, stored.attempts, stored.held_by, stored.receiver) == (
            DeliveryStatus.PENDING, 0, None, key)

    # WHEN its time comes (no operator)
    with svc.db.transaction() as tx:
        tx.execute("UPDATE delivery_destinations SET paused_until = :now WHERE key = :key",
                   {"now": utcnow() - timedelta(seconds=1), "key": key})
    last = drain_once(svc)

    # THEN everything goes out once, in order, within the host's rate
    assert last["recovered"] == 7 and last["expired"] == 0
    sent = providers.webhook.received[1:]
    assert [r["body"]["text"] for r in sent] == ["old"] + [f"n{n}" for n in range(6)]
    assert len(providers.webhook.delivered) == 8, "each once"
    arrived = [int(r["at"] * US) for r in sent]
    assert most_in_any_window(arrived, US) <= 2 + 1
    assert {store.get(e.id).attempts for e in waiting} == {1}


class Stalling:
    """A busy machine's clock: it stalls for a second right after the drain sets an entry
    aside for a rate slot (the stall the slot frees in)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset

    def utcnow(self) -> datetime:
        return datetime.fromtimestamp(self.now(), UTC)


def test_a_slot_that_frees_mid_batch_lets_no_later_entry_overtake_the_one_set_aside(
        db_url: str, providers: Providers, make_services: Callable[..., Services],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a webhook host limited to 2 a second, six alerts to it claimed in one batch,
    # on a machine so busy that its slot frees while the batch is still being worked
    svc = make_services(db_url, **providers.env(), SLUICE_WEBHOOK_HOST_RATE_PER_SECOND="2",
                        SLUICE_DELIVERY_RATE_WAIT_SECONDS="0")
    store = DeliveryStore(svc.db)
    for n in range(6):
        store.enqueue("webhook", providers.webhook.url, {"text": f"n{n}"})
    busy = Stalling()
    paced = Destinations.paced

    def paced_then_stall(self: Destinations, *args: Any, **kwargs: Any) -> None:
        paced(self, *args, **kwargs)
        busy.offset += 1.0

    monkeypatch.setattr(drain_module, "utcnow", busy.utcnow)
    monkeypatch.setattr(Destinations, "paced", paced_then_stall)
    limiter = Limiter.from_services(svc, clock=busy.now)

    # WHEN drains run until all are sent
    with Outbound.open(svc.settings) as client:
        first = Deliverer.from_services(svc, client, limiter=limiter).drain(Deadline(20))
        for _ in range(20):
            if len(providers.webhook.delivered) == 6:
                break
            Deliverer.from_services(svc, client, limiter=limiter).drain(Deadline(20))

    # THEN a slot was missed in the first batch, and still every alert went once, in order
    assert first["rateLimited"] >= 1
    assert [r["body"]["text"] for r in providers.webhook.received] == [
        f"n{n}" for n in range(6)]


def test_a_paused_and_failing_destination_keeps_its_entries_for_its_probe_after_the_pause(
        svc: Services, providers: Providers) -> None:
    store, key = DeliveryStore(svc.db), hook_key(providers)
    # two entries answered 503 (three tries each) before any success: the receiver's
    providers.webhook.answers.extend([503] * 6)
    entries = [store.enqueue("webhook", providers.webhook.url, {"text": str(n)})[0]
               for n in range(3)]
    first = drain_once(svc)
    assert [d["key"] for d in first["outages"]["destinations"]] == [key]
    assert {store.get(e.id).attempts for e in entries} == {0}, "the receiver's: none counted"
    apply(svc, parse_change("pause", key, {"until": iso_z(utcnow() + timedelta(hours=1))}))
    answer = apply(svc, parse_change("resume", key, {}))
    assert answer["current"]["state"] == "failing"
    # resumed, they are due, and still wait for the receiver's probe
    assert drain_once(svc)["recovered"] == 0
    assert len(providers.webhook.received) == 6, "nothing sent before the probe is due"
    assert {store.get(e.id).status for e in entries} == {DeliveryStatus.PENDING}
    with svc.db.transaction() as tx:  # its probe is due
        tx.execute("UPDATE delivery_destinations SET next_probe_at = :now",
                   {"now": utcnow() - timedelta(seconds=1)})
    assert drain_once(svc)["recovered"] == 3


class Clock:
    """Time that moves only when a sender sleeps, from now (every sender shares it)."""

    def __init__(self) -> None:
        self.t = time.time()
        self.lock = threading.Lock()

    def now(self) -> float:
        with self.lock:
            return self.t

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.t += seconds


def to_chat(chat: str) -> DeliveryEntry:
    return entry("telegram", chat)._replace(destination=f"telegram:{chat}")


def honoured_across_senders(inner: RateStore, db: Database) -> None:
    """Four senders, 40 messages to one chat, on one clock; an override of 2 a second for
    the chat's first 5 s (the setting allows 100 a second)."""
    recorded, clock = Recorded(inner), Clock()
    settings = Settings.from_env({"SLUICE_TELEGRAM_RATE_PER_SECOND": "1000",
                                  "SLUICE_TELEGRAM_CHAT_RATE_PER_SECOND": "100"})
    until = datetime.fromtimestamp(clock.now() + 5, UTC)
    Destinations(db, 3).override_rate("telegram:1001", 2, 1, until)
    errors: list[BaseException] = []

    def sender() -> None:
        limiter = Limiter(recorded, settings, clock=clock.now, sleep=clock.sleep,
                          overrides=lambda now: read_overrides(db, now))
        try:
            for _ in range(10):
                while limiter.acquire(to_chat("1001")) > 0:
                    clock.sleep(0.01)  # set aside: this sender comes back to it later
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=sender) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    grants = sorted(recorded.granted["telegram:chat:1001"])
    assert len(grants) == 40
    end_us = int(until.timestamp() * US)
    under = [g for g in grants if g < end_us]
    after = [g for g in grants if g >= end_us]
    # under the override: 2 a second, whatever the number of senders (never closer than
    # its interval, at most its limit plus the one on a window's edge)
    assert min(b - a for a, b in itertools.pairwise(under)) >= US // 2
    assert most_in_any_window(under, US) <= 2 + 1 and len(under) <= 2 * 5 + 1
    # after its time, the setting's rate again: closer than the override, never closer
    # than the setting's interval
    assert most_in_any_window(after, US // 2) >= 3
    assert min(b - a for a, b in itertools.pairwise(after)) >= US // 100

    # AND it lapses exactly at its time: a slot taken just before its end under the
    # override does not hold the key past the end
    clock.t = until.timestamp() + 60
    again = datetime.fromtimestamp(clock.now() + 1, UTC)
    Destinations(db, 3).override_rate("telegram:1002", 2, 1, again)
    limiter = Limiter(recorded, settings, clock=clock.now, sleep=clock.sleep,
                      overrides=lambda now: read_overrides(db, now))
    limiter.max_wait_s = 0.0  # report the wait instead of sleeping it
    clock.t = again.timestamp() - 0.1
    assert limiter.acquire(to_chat("1002")) == 0.0
    assert limiter.acquire(to_chat("1002")) > 0.05, "the override's interval, before its end"
    clock.t = again.timestamp()
    assert limiter.acquire(to_chat("1002")) == 0.0, "at its end, not an interval later"
    assert limiter.acquire(to_chat("1002")) <= 0.0106, "then the setting's interval"


def test_a_rate_override_is_honoured_across_concurrent_senders_and_lapses_db(
        db_url: str, make_services: Callable[..., Services]) -> None:
    db = make_services(db_url).db
    honoured_across_senders(DbRates(db), db)


def test_a_rate_override_is_honoured_across_concurrent_senders_and_lapses_redis(
        db_url: str, redis_env: dict[str, str],
        make_services: Callable[..., Services]) -> None:
    svc = make_services(db_url, **redis_env)
    honoured_across_senders(RedisRates(svc.redis), svc.db)


def test_a_rate_override_reaches_the_drain_and_its_email_server(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    """The SMTP server has no rate of its own: an override gives it one, for every sender."""
    svc = make_services(db_url, **providers.env(), SLUICE_DELIVERY_RATE_WAIT_SECONDS="0")
    store = DeliveryStore(svc.db)
    store.enqueue("email", "a@example.com", {"text": "first", "subject": "s"})
    drain_once(svc)
    key = store.list(limit=1)[0].destination
    assert key is not None and key.startswith("email:")
    apply(svc, parse_change("rate", key, {"limit": 1, "per": "minute",
                                          "until": iso_z(utcnow() + timedelta(hours=1))}))
    for n in range(3):
        store.enqueue("email", "a@example.com", {"text": f"n{n}", "subject": "s"})
    result = drain_once(svc)
    assert result["recovered"] == 1 and result["rateLimited"] == 2, "1 a minute"
    assert len(providers.smtp.messages) == 2
