"""A provider's pacing answer (``Retry-After``, Telegram's ``retry_after``) against the real
stand-ins: a hostile one fails no entry and holds nothing past the cap, and every message
still arrives exactly once (judged from what the stand-ins received)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from email.utils import formatdate

from sluice.core.services import Services
from sluice.delivery.ratelimit import US
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.store.db import utcnow
from tests.integration.delivery.conftest import WIDE_RATES
from tests.integration.delivery.helpers import Providers, drain_once, due_now

CAP_S = 3600
HOSTILE = ["nan", "inf", "-5", "1e12", "999999999", "1e400", "date-in-cap", "date-past-cap"]
# Telegram's JSON spells the same answers as JSON tokens (a str is spliced in raw)
AS_JSON = {"nan": "NaN", "inf": "Infinity"}


def _header(asked: str) -> str:
    if asked == "date-in-cap":
        return formatdate(time.time() + 600, usegmt=True)
    if asked == "date-past-cap":
        return formatdate(time.time() + 400 * 86400, usegmt=True)
    return asked


def _held_until_s(svc: Services) -> float:
    """The latest moment anything waits for: a rate key, a destination's probe, an entry."""
    with svc.db.transaction() as tx:
        keys = [int(r["next_at_us"]) / US for r in tx.fetchall(
            "SELECT next_at_us FROM delivery_rate_limits")]
        probes = [r["next_probe_at"] for r in tx.fetchall(
            "SELECT next_probe_at FROM delivery_destinations")]
    entries = [e.next_attempt_at for e in DeliveryStore(svc.db).list()]
    times = keys + [t.timestamp() for t in probes + entries if not isinstance(t, str)]
    return max(times, default=time.time())


def _seconds(moment: datetime | str) -> float:
    """A stored time as epoch seconds (SQLite hands back the text it stored)."""
    return (datetime.fromisoformat(moment) if isinstance(moment, str) else moment).timestamp()


def _send_one_each(svc: Services, providers: Providers, label: str) -> dict[str, str]:
    store = DeliveryStore(svc.db)
    return {channel: store.enqueue(channel, recipient, {"text": f"{label} to {channel}"})[0].id
            for channel, recipient in (("webhook", providers.webhook.url),
                                       ("slack", "C0ALERTS"), ("telegram", "1001"))}


def _until_all_acked(svc: Services, ids: dict[str, str]) -> None:
    store = DeliveryStore(svc.db)
    for _ in range(6):
        if {store.get(i).status for i in ids.values()} == {DeliveryStatus.ACKED}:
            return
        _waits_over(svc)
        result = drain_once(svc)
        assert result["failed"] == 0 and result["skippedMaxRetries"] == 0, result


def _waits_over(svc: Services) -> None:
    """Time travel: every entry, probe and rate key is due (the honoured waits passed)."""
    due_now(svc)
    with svc.db.transaction() as tx:
        tx.execute("DELETE FROM delivery_rate_limits")


def test_a_hostile_pacing_answer_fails_nothing_and_holds_nothing_past_the_cap(
        svc: Services, providers: Providers) -> None:
    for asked in HOSTILE:
        # GIVEN three providers that answer 429 with the same hostile wait three times
        header = _header(asked)
        providers.webhook.answers.extend([(429, {"retry-after": header})] * 3)
        providers.slack.answers.extend([(429, {"ok": False, "error": "ratelimited"},
                                         {"retry-after": header})] * 3)
        providers.telegram.flood_wait.extend(
            [AS_JSON.get(asked, asked if not asked.startswith("date") else f'"{header}"')] * 3)
        ids = _send_one_each(svc, providers, asked)
        started = time.time()

        # WHEN a drain meets them
        first = drain_once(svc)

        # THEN no entry failed or lost an attempt, and nothing waits past the cap
        assert first["failed"] == 0 and first["skippedMaxRetries"] == 0, (asked, first)
        store = DeliveryStore(svc.db)
        for entry_id in ids.values():
            entry = store.get(entry_id)
            assert entry.status is DeliveryStatus.PENDING and entry.attempts == 0, (asked, entry)
        assert _held_until_s(svc) <= started + CAP_S + 5, asked
        # AND once the providers accept, each message arrives exactly once
        _until_all_acked(svc, ids)
        assert not (providers.webhook.answers or providers.slack.answers
                    or providers.telegram.flood_wait), asked
        _waits_over(svc)
    texts = [m["text"] for m in providers.telegram.messages + providers.slack.messages]
    assert sorted(texts) == sorted(f"{asked} to {channel}" for asked in HOSTILE
                                   for channel in ("slack", "telegram"))
    delivered = [r["body"]["text"] for r in providers.webhook.received]
    assert len(delivered) == 4 * len(HOSTILE), "three refusals and one acceptance each"
    assert sorted(p["text"] for p in providers.webhook.delivered.values()) == sorted(
        f"{asked} to webhook" for asked in HOSTILE)


def test_an_answer_within_the_cap_is_honoured_and_one_past_it_holds_no_shared_key(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    # GIVEN a cap of a minute; Telegram asks for 45 s, Slack for two days
    svc = make_services(db_url, **providers.env(), **WIDE_RATES,
                        SLUICE_DELIVERY_PACING_CAP_SECONDS="60")
    providers.telegram.flood_wait.append(45)
    providers.slack.answers.append((429, {"ok": False, "error": "ratelimited"},
                                    {"retry-after": str(2 * 86400)}))
    store = DeliveryStore(svc.db)
    chat, _ = store.enqueue("telegram", "1001", {"text": "chat"})
    channel, _ = store.enqueue("slack", "C0ALERTS", {"text": "channel"})
    started = utcnow()

    result = drain_once(svc)

    # THEN the chat's key is held the 45 s asked (a rate limit: no attempt counted) ...
    assert result["rateLimited"] == 1 and result["failed"] == 0
    waited = store.get(chat.id)
    assert waited.attempts == 0 and "rate limited" in (waited.last_error or "")
    assert timedelta(seconds=44) <= waited.next_attempt_at - started <= timedelta(seconds=50)
    with svc.db.transaction() as tx:
        held = {r["key"]: int(r["next_at_us"]) / US for r in tx.fetchall(
            "SELECT key, next_at_us FROM delivery_rate_limits")}
    assert held["telegram:chat:1001"] - started.timestamp() >= 44
    # ... and so is its receiver (the chat): nothing more of it is claimed before then
    with svc.db.transaction() as tx:
        rows = {r["key"]: r for r in tx.fetchall("SELECT * FROM delivery_destinations")}
    assert rows["telegram:1001"]["down_since"] is None, "a pacing answer is no outage"
    assert _seconds(rows["telegram:1001"]["ready_at"]) - started.timestamp() >= 44
    # ... while the Slack channel that asked past the cap is a failing receiver on its
    # probe schedule (10 min at most), and its shared key is not held for the answer
    slack = store.get(channel.id)
    assert slack.attempts == 0 and slack.held_by is None, "held by its receiver's row alone"
    assert rows["slack:C0ALERTS"]["down_since"] is not None
    assert [d["key"] for d in result["outages"]["destinations"]] == ["slack:C0ALERTS"]
    assert slack.next_attempt_at - started <= timedelta(seconds=601)
    assert held.get("slack:channel:C0ALERTS", 0) - started.timestamp() < 5
    assert len(providers.slack.http.requests) == 1, "no in-process retry of an over-cap answer"
