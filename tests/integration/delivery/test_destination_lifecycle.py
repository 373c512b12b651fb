"""A destination's lifecycle, judged from what the stand-ins received: a webhook answering
``410 Gone`` and a chat that blocked the bot are disabled, later entries fail
``destination_disabled`` without a request, and an enable plus a redrive delivers them
once; a destination failing five (simulated) days without a success is disabled and pages,
one success before that resets the clock; effect records keep alerts from being re-armed
by any of it. Both backends, real stand-ins."""

from __future__ import annotations

from datetime import timedelta

from sluice.core.services import Services
from sluice.delivery.store import DeliveryStatus, DeliveryStore, Effect
from sluice.ops.destinations import apply, parse_change
from sluice.store.db import utcnow
from tests.integration.delivery.helpers import Providers, drain_once, due_now
from tests.integration.delivery.test_delivery_outages import Recording


def hook_key(providers: Providers) -> str:
    """The webhook's receiver (its host and port: where outages live)."""
    return f"webhook:127.0.0.1:{providers.webhook.url.split(':')[2].split('/')[0]}"


def url_key(providers: Providers) -> str:
    """The webhook's destination (its exact URL: what a 410 disables)."""
    return f"webhook:{providers.webhook.url}"


def change(svc: Services, action: str, key: str, **body: object) -> dict[str, object]:
    return apply(svc, parse_change(action, key, dict(body)))


def disabled_since(svc: Services, key: str) -> object:
    with svc.db.transaction() as tx:
        row = tx.fetchone("SELECT disabled_at FROM delivery_destinations WHERE key = :key",
                          {"key": key})
    return None if row is None else row["disabled_at"]


def test_a_410_disables_the_webhook_the_next_alert_fails_unsent_and_enable_redrive_sends_it_once(
        svc: Services, providers: Providers) -> None:
    # GIVEN a webhook that answers 410 Gone to an alert
    store, key = DeliveryStore(svc.db), url_key(providers)
    svc.reporter = reporter = Recording()
    providers.webhook.answers.append(410)
    first, _ = store.enqueue("webhook", providers.webhook.url, {"text": "first"})
    result = drain_once(svc)

    # THEN the destination (that URL, not its host) is disabled, says why, and pages
    # (metric, error tracker)
    assert list(result["disabled"]) == [key] and "410" in result["disabled"][key]
    assert result["failed"] == 0 and result["failedDisabled"] == 1
    assert disabled_since(svc, key) is not None
    assert disabled_since(svc, hook_key(providers)) is None
    assert reporter.errors == ["delivery-drain: DestinationDisabled"]
    [(values, _)] = reporter.recorded
    assert values["QueueDrained.destinationsDisabled"] == 1.0
    gone = store.get(first.id)
    assert (gone.status, gone.failure_reason, gone.attempts) == (
        DeliveryStatus.FAILED, "destination_disabled", 1)

    # WHEN another alert goes to the same URL
    second, _ = store.enqueue("webhook", providers.webhook.url, {"text": "second"})
    again = drain_once(svc)

    # THEN it fails destination_disabled at once, attempts untouched, without a request
    assert len(providers.webhook.received) == 1, "no request for the second"
    assert again["failedDisabled"] == 1 and again["disabled"] == {}
    unsent = store.get(second.id)
    assert (unsent.status, unsent.failure_reason, unsent.attempts) == (
        DeliveryStatus.FAILED, "destination_disabled", 0)
    assert unsent.destination == key

    # WHEN the receiver is back, the operator enables the destination and redrives it
    change(svc, "enable", key)
    store.redrive(second.id)
    drain_once(svc)
    drain_once(svc)

    # THEN it is delivered once
    assert [r["body"]["text"] for r in providers.webhook.received] == ["first", "second"]
    assert store.get(second.id).status is DeliveryStatus.ACKED
    assert store.get(first.id).status is DeliveryStatus.FAILED, "only what was redriven"


def test_a_chat_that_blocked_the_bot_is_disabled_and_its_backlog_fails_without_a_request(
        svc: Services, providers: Providers) -> None:
    # GIVEN three messages for a chat that blocked the bot
    store = DeliveryStore(svc.db)
    entries = [store.enqueue("telegram", "1002", {"text": str(n)})[0] for n in range(3)]

    # WHEN the first is refused "bot was blocked by the user"
    result = drain_once(svc)

    # THEN the chat is disabled; the others fail with it, no request made for them
    assert list(result["disabled"]) == ["telegram:1002"]
    providers.telegram.blocked.discard("1002")  # a request now would be taken: none comes
    drain_once(svc)
    assert providers.telegram.messages == []
    assert [store.get(e.id).failure_reason for e in entries] == ["destination_disabled"] * 3
    assert [store.get(e.id).attempts for e in entries] == [1, 0, 0]
    # AND other chats are untouched
    store.enqueue("telegram", "1001", {"text": "fine"})
    assert drain_once(svc)["recovered"] == 1


def backdate_failing(svc: Services, key: str, days: float) -> None:
    """Time travel: the destination has been failing for ``days``."""
    with svc.db.transaction() as tx:
        tx.execute("UPDATE delivery_destinations SET down_since = :then WHERE key = :key",
                   {"then": utcnow() - timedelta(days=days), "key": key})


def test_a_destination_failing_five_days_without_a_success_is_disabled_and_pages(
        svc: Services, providers: Providers) -> None:
    # GIVEN a receiver down since its first alerts (a second one failing before any
    # success makes the failure the receiver's, not an entry's own)
    store, key = DeliveryStore(svc.db), hook_key(providers)
    svc.reporter = reporter = Recording()
    providers.webhook.answers.extend([503] * 1000)
    entries = [store.enqueue("webhook", providers.webhook.url, {"text": x})[0] for x in "xy"]
    assert [d["key"] for d in drain_once(svc)["outages"]["destinations"]] == [key]

    # WHEN its probes fail on for four days and then past the fifth
    disabled = []
    for days in (1, 4, 4.99, 5.01):
        backdate_failing(svc, key, days)
        due_now(svc)
        result = drain_once(svc)
        disabled.append(sorted(result["disabled"]))

    # THEN it is disabled at the first failed probe past five days, and the alarm's metric
    # and the error tracker say so once
    assert disabled == [[], [], [], [key]]
    assert [v["QueueDrained.destinationsDisabled"] for v, _ in reporter.recorded] == [
        0.0, 0.0, 0.0, 0.0, 1.0]
    assert reporter.errors == ["delivery-drain: DestinationDisabled"]
    for entry in entries:
        ended = store.get(entry.id)
        assert (ended.status, ended.failure_reason, ended.attempts) == (
            DeliveryStatus.FAILED, "destination_disabled", 0)
    # AND it is not probed any more
    sent = len(providers.webhook.received)
    due_now(svc)
    drain_once(svc)
    assert len(providers.webhook.received) == sent


def test_one_success_before_the_five_days_resets_the_clock(
        svc: Services, providers: Providers) -> None:
    # GIVEN a receiver failing for four days and a half (two entries answered 503)
    store, key = DeliveryStore(svc.db), hook_key(providers)
    providers.webhook.answers.extend([503] * 6)
    for text in ("one", "one more"):
        store.enqueue("webhook", providers.webhook.url, {"text": text})
    assert [d["key"] for d in drain_once(svc)["outages"]["destinations"]] == [key]
    backdate_failing(svc, key, 4.5)

    # WHEN it takes its entries, then fails again (two more entries) for a day
    due_now(svc)
    assert drain_once(svc)["recovered"] == 2
    providers.webhook.answers.extend([503] * 1000)
    for text in ("two", "three"):
        store.enqueue("webhook", providers.webhook.url, {"text": text})
    assert [d["key"] for d in drain_once(svc)["outages"]["destinations"]] == [key]
    backdate_failing(svc, key, 1)
    due_now(svc)
    result = drain_once(svc)

    # THEN five days have not passed since its last success: it fails on, not disabled
    assert result["disabled"] == {} and disabled_since(svc, key) is None
    assert result["outages"]["destinations"][0]["key"] == key


def test_effect_records_keep_an_alert_from_being_re_armed_by_a_disable(
        svc: Services, providers: Providers) -> None:
    # GIVEN an alert enqueued with its effect record, to a webhook that answers 410
    store, key = DeliveryStore(svc.db), url_key(providers)
    providers.webhook.answers.append(410)
    alert = "alert:scope-1:rule-1:story-1"
    first, created = store.enqueue("webhook", providers.webhook.url, {"text": "a"},
                                   idempotency_key=alert,
                                   effect=Effect("alert", "scope-1", "story-1"))
    assert created
    drain_once(svc)
    assert store.get(first.id).failure_reason == "destination_disabled"

    # WHEN the sweep offers the same match again, after an enable, and after a prune
    change(svc, "enable", key)
    again, created_again = store.enqueue("webhook", providers.webhook.url, {"text": "a"},
                                         idempotency_key=alert,
                                         effect=Effect("alert", "scope-1", "story-1"))
    store.prune(utcnow() + timedelta(days=1))

    # THEN nothing new is armed: the key is the first entry's, and its effect stays
    assert (again.id, created_again) == (first.id, False)
    assert store.known_effects([alert]) == {alert}
    assert store.list(limit=10) == []
    drain_once(svc)
    assert len(providers.webhook.received) == 1
