"""A late answer never multiplies messages: Telegram, Slack and SMTP stand-ins that take
every message and answer after the send timeout, over ten drains, get each entry at most
twice (the default SLUICE_DELIVERY_UNKNOWN_RESENDS=1), the entry rests ``unknown``, every
run's summary counts it, and no entry passes ``max_attempts``. A webhook receiver that
deduplicates by ``Idempotency-Key`` acts on its entry once. Both backends, real stand-ins."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from sluice.core.services import Services
from sluice.delivery.store import DEFAULT_SCHEDULE, DeliveryStatus, DeliveryStore
from tests.integration.delivery.helpers import Providers, drain_once, due_now

LATE_S = 0.8


@pytest.fixture
def late_svc(db_url: str, providers: Providers,
             make_services: Callable[..., Services]) -> Iterator[Services]:
    yield make_services(db_url, **{**providers.env(),
                                   "SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS": "0.3"})
    providers.webhook.release.set()


def test_late_answers_reach_each_chat_at_most_twice_and_rest_unknown(
        late_svc: Services, providers: Providers) -> None:
    providers.telegram.late_s = providers.slack.late_s = providers.smtp.late_s = LATE_S
    store = DeliveryStore(late_svc.db)
    entries = [store.enqueue(channel, recipient, {"text": f"alert to {channel}"})[0]
               for channel, recipient in (("telegram", "1001"), ("slack", "C0ALERTS"),
                                          ("email", "ops@example.com"))]

    unknown = []
    for _ in range(10):
        result = drain_once(late_svc)
        unknown.append(result["unknown"])
        assert result["failed"] == result["skippedMaxRetries"] == 0
        due_now(late_svc)

    assert unknown[:2] == [3, 3] and sum(unknown) == 6, "each send counted, then none"
    assert len(providers.telegram.messages) == 2
    assert len(providers.slack.messages) == 2
    assert len(providers.smtp.messages) == 2
    for entry in entries:
        stored = store.get(entry.id)
        assert stored.status is DeliveryStatus.UNKNOWN, stored
        assert stored.unknown_sends == 2 and stored.attempts == 2
        assert stored.attempts <= DEFAULT_SCHEDULE.max_attempts

    # AND the operator settles them: one confirmed, one sent again (once more), one purged
    telegram, slack, email = entries
    assert store.mark_delivered(telegram.id).status is DeliveryStatus.ACKED
    providers.slack.late_s = 0
    store.send_again(slack.id)
    store.purge(email.id)
    assert drain_once(late_svc)["recovered"] == 1
    assert len(providers.slack.messages) == 3
    assert store.get(slack.id).status is DeliveryStatus.ACKED


def test_a_deduplicating_webhook_acts_once_on_late_answers(
        late_svc: Services, providers: Providers) -> None:
    providers.webhook.slow = 3  # three requests taken, answered too late
    store = DeliveryStore(late_svc.db)
    entry, _ = store.enqueue("webhook", providers.webhook.url, {"text": "x"},
                             idempotency_key="alert:late:1")
    results = []
    for _ in range(10):
        results.append(drain_once(late_svc))
        due_now(late_svc)
    assert [r["unknown"] for r in results][:3] == [1, 1, 1]
    assert sum(r["recovered"] for r in results) == 1
    assert len(providers.webhook.received) == 4, "resent within the attempt limit"
    assert list(providers.webhook.delivered) == ["alert:late:1"], "acted on once"
    stored = store.get(entry.id)
    assert stored.status is DeliveryStatus.ACKED and stored.attempts == 4
