"""The refusals the delivery queue names as permanent ("conversation not found", "user
deactivated", "message too long", "invalid format") fail their entry at its first attempt
whatever the status they come with, a 403 included, against the Telegram and Slack stand-ins
through the delivery-drain job; a 403 naming none of them still holds its destination."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sluice.core.services import Services
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from tests.integration.delivery.helpers import Providers, drain_once, seed

NAMED = ("Conversation not found", "User deactivated", "Message too long", "Invalid format")


def fail_each(svc: Services, channel: str, recipient: str,
              script: Callable[[str], None]) -> None:
    """Each named refusal, scripted as the receiver's next answer by ``script``, fails its
    entry at its first attempt, counted in the drain's ``failed``."""
    store = DeliveryStore(svc.db)
    for text in NAMED:
        script(text)
        entry, _ = store.enqueue(channel, recipient, {"text": f"to {channel}: {text}"})

        result = drain_once(svc)

        assert seed(result)["failed"] == 1, (text, result)
        stored = store.get(entry.id)
        assert stored.status is DeliveryStatus.FAILED, (text, stored.status)
        assert (stored.attempts, stored.failure_reason) == (1, "permanent")
        assert text in (stored.last_error or "")


@pytest.mark.parametrize("status", [400, 403])
def test_a_named_permanent_refusal_fails_at_once_whatever_the_status(
        svc: Services, providers: Providers, sleeps: list[float], status: int) -> None:
    fail_each(svc, "telegram", "1001", lambda text: providers.telegram.script.append(
        (status, {"ok": False, "error_code": status, "description": f"Forbidden: {text}"})))
    fail_each(svc, "slack", "C0ALERTS", lambda text: providers.slack.answers.append(
        (status, {"ok": False, "error": text}, {})))

    assert providers.telegram.messages == providers.slack.messages == []
    assert sleeps == [], "never retried in process"


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
