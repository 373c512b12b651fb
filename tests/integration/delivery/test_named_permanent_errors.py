"""The refusals the delivery queue names as permanent ("conversation not found", "user
deactivated", "message too long", "invalid format") fail their entry at its first attempt
whatever the status they come with, a 403 included, against the Telegram and Slack stand-ins
through the delivery-drain job; a 403 naming none of them still holds its destination."""

from __future__ import annotations

import pytest

from sluice.core.services import Services
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from tests.integration.delivery.helpers import Providers, drain_once, seed

NAMED = ("Conversation not found", "User deactivated", "Message too long", "Invalid format")


@pytest.mark.parametrize("status", [400, 403])
def test_a_named_permanent_refusal_fails_at_once_whatever_the_status(
        svc: Services, providers: Providers, sleeps: list[float], status: int) -> None:
    store = DeliveryStore(svc.db)
    for text in NAMED:
        providers.telegram.script.append(
            (status, {"ok": False, "error_code": status, "description": f"Forbidden: {text}"}))
        entry, _ = store.enqueue("telegram", "1001", {"text": f"to telegram: {text}"})

        result = drain_once(svc)

        assert seed(result)["failed"] == 1, (text, result)
        stored = store.get(entry.id)
        assert stored.status is DeliveryStatus.FAILED, (text, stored.status)
        assert (stored.attempts, stored.failure_reason) == (1, "permanent")
        assert text in (stored.last_error or "")
    assert providers.telegram.messages == [] and sleeps == []

    for text in NAMED:
        providers.slack.answers.append((status, {"ok": False, "error": text}, {}))
        entry, _ = store.enqueue("slack", "C0ALERTS", {"text": f"to slack: {text}"})

        result = drain_once(svc)

        assert seed(result)["failed"] == 1, (text, result)
        stored = store.get(entry.id)
        assert stored.status is DeliveryStatus.FAILED, (text, stored.status)
        assert (stored.attempts, stored.failure_reason) == (1, "permanent")
    assert providers.slack.messages == [] and sleeps == []


def test_a_403_naming_no_recipient_problem_still_holds_the_destination(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    providers.telegram.script.append(
        (403, {"ok": False, "error_code": 403, "description": "Forbidden: wrong token"}))
    entry, _ = store.enqueue("telegram", "1001", {"text": "held"})

    result = drain_once(svc)

    assert seed(result)["failed"] == 0
    stored = store.get(entry.id)
    assert (stored.status, stored.attempts) == (DeliveryStatus.PENDING, 0)
