"""The adapters against local stand-ins speaking each platform's documented shapes, and the
delivery-drain job end to end on both backends."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import httpx
import pytest

from shared.core.services import Services
from shared.delivery.drain import AttemptOutcome, Deliverer
from shared.delivery.store import DeliveryStatus, DeliveryStore
from shared.jobs.registry import Deadline, get_job
from shared.jobs.runner import run_job
from shared.store.db import utcnow
from tests.conftest import free_port
from tests.providers.slack import SlackStandIn
from tests.providers.smtp import SmtpServer
from tests.providers.telegram import TelegramStandIn
from tests.providers.webhook import WebhookReceiver

WEBHOOK_SECRET = "webhook-secret-for-tests-0123456789"


@dataclass
class Providers:
    webhook: WebhookReceiver
    slack: SlackStandIn
    telegram: TelegramStandIn
    smtp: SmtpServer

    def env(self) -> dict[str, str]:
        return {
            "SLUICE_WEBHOOK_SIGNING_SECRET": WEBHOOK_SECRET,
            "SLUICE_SLACK_BOT_TOKEN": self.slack.token, "SLUICE_SLACK_API_URL": self.slack.url,
            "SLUICE_TELEGRAM_BOT_TOKEN": self.telegram.token,
            "SLUICE_TELEGRAM_API_URL": self.telegram.url,
            "SLUICE_SMTP_HOST": "127.0.0.1", "SLUICE_SMTP_PORT": str(self.smtp.port),
            "SLUICE_SMTP_SECURITY": "none", "SLUICE_SMTP_FROM": "alerts@sluice.test",
            "SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS": "5",
        }


@pytest.fixture
def providers() -> Iterator[Providers]:
    with (WebhookReceiver(WEBHOOK_SECRET) as webhook, SlackStandIn(archived=("C0OLD",)) as slack,
          TelegramStandIn(chats=("1001", "1002"), blocked=("1002",)) as telegram,
          SmtpServer() as smtp):
        smtp.unknown.add("gone@example.com")
        smtp.busy.add("busy@example.com")
        yield Providers(webhook, slack, telegram, smtp)


@pytest.fixture
def svc(db_url: str, providers: Providers, make_services: Callable[..., Services]) -> Services:
    return make_services(db_url, **providers.env())


def _drain(services: Services) -> dict[str, int]:
    outcome = run_job(get_job("delivery-drain"), services, "cli")
    assert outcome.status == 200, outcome.body
    return outcome.body


def _due_now(services: Services) -> None:
    """Time travel: every pending entry's backoff has passed."""
    with services.db.transaction() as tx:
        tx.execute("UPDATE delivery_queue SET next_attempt_at = :now WHERE status = 'pending'",
                   {"now": utcnow() - timedelta(seconds=1)})


def test_the_drain_delivers_to_every_channel(svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    hook, _ = store.enqueue("webhook", providers.webhook.url, {"alert": "cpu", "text": "hot"},
                            idempotency_key="alert:cpu:1")
    store.enqueue("slack", "C0ALERTS", {"text": "slack hello"})
    store.enqueue("telegram", "1001", {"text": "telegram hello", "silent": True})
    mail, _ = store.enqueue("email", "ops@example.com",
                            {"subject": "Alert", "text": "plain", "html": "<b>html</b>"})

    result = _drain(svc)

    assert result == {"recovered": 4, "failed": 0, "skippedMaxRetries": 0, "deferredBackoff": 0}
    [received] = providers.webhook.received
    assert received["key"] == "alert:cpu:1" and received["body"] == {"alert": "cpu",
                                                                      "text": "hot"}
    assert received["headers"]["x-sluice-delivery-id"] == hook.id
    assert providers.slack.messages == [{"channel": "C0ALERTS", "text": "slack hello",
                                         "ts": "1700000000.000001"}]
    assert providers.telegram.messages[0]["text"] == "telegram hello"
    [message] = providers.smtp.messages
    assert (message["To"], message["From"], message["Subject"]) == (
        "ops@example.com", "alerts@sluice.test", "Alert")
    assert message["Idempotency-Key"] == mail.id and message.is_multipart()
    ids = {e.channel: e.platform_message_id for e in store.list()}
    assert ids == {"webhook": "evt_1", "slack": "C0ALERTS:1700000000.000001", "telegram": "1",
                   "email": message["Message-ID"]}
    assert all(e.status is DeliveryStatus.ACKED and e.duration_ms is not None
               for e in store.list())


def test_permanent_errors_and_missing_adapters_fail_at_once_with_their_reason(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    cases = {
        ("telegram", "999"): "telegram 400: Bad Request: chat not found",
        ("telegram", "1002"): "telegram 403: Forbidden: bot was blocked by the user",
        ("slack", "C0NOPE"): "slack: channel_not_found",
        ("slack", "C0OLD"): "slack: is_archived",
        ("email", "gone@example.com"): "email: recipient address rejected: 550 5.1.1 user unknown",
        ("webhook", providers.webhook.http.url + "/nowhere"): "webhook answered 404",
        ("sms", "+4670000000"): "MissingAdapter: no adapter configured for channel 'sms'",
    }
    for channel, recipient in cases:
        store.enqueue(channel, recipient, {"text": "x"})
    store.enqueue("telegram", "1001", {"text": "y" * 5000})

    result = _drain(svc)

    assert result == {"recovered": 0, "failed": 8, "skippedMaxRetries": 0, "deferredBackoff": 0}
    failed = {(e.channel, e.recipient): e for e in store.list(status=DeliveryStatus.FAILED)}
    for key, reason in cases.items():
        assert reason in (failed[key].last_error or ""), failed[key].last_error
        assert failed[key].attempts == 1
    assert "message is too long" in (failed[("telegram", "1001")].last_error or "")
    assert _drain(svc)["failed"] == 0, "a failed entry is never tried again"


def test_transient_errors_wait_out_the_schedule_then_deliver(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    providers.telegram.flood_wait.append(30)
    providers.webhook.answers.append(503)
    providers.slack.answers.append((429, {"ok": False, "error": "ratelimited"},
                                    {"retry-after": "12"}))
    for channel, recipient in (("telegram", "1001"), ("webhook", providers.webhook.url),
                               ("slack", "C0ALERTS"), ("email", "busy@example.com")):
        store.enqueue(channel, recipient, {"text": f"to {channel}"})
    started = utcnow()

    first = _drain(svc)

    assert first == {"recovered": 0, "failed": 0, "skippedMaxRetries": 0, "deferredBackoff": 4}
    waits = {e.channel: (e.next_attempt_at - started).total_seconds()
             for e in store.list(status=DeliveryStatus.PENDING)}
    assert 30 <= waits["telegram"] < 35, "Telegram's retry_after lengthens the 5 s step"
    assert 12 <= waits["slack"] < 17, "Slack's Retry-After too"
    assert 5 <= waits["webhook"] < 10 and 5 <= waits["email"] < 10
    assert "retry after 30" in (store.list(channel="telegram")[0].last_error or "")
    assert _drain(svc)["deferredBackoff"] == 4, "not due yet: nothing is sent"

    providers.smtp.busy.clear()
    _due_now(svc)
    second = _drain(svc)
    assert second == {"recovered": 4, "failed": 0, "skippedMaxRetries": 0, "deferredBackoff": 0}
    assert {e.attempts for e in store.list()} == {2}


def test_the_fifth_transient_failure_ends_the_entry_as_skipped_max_retries(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    entry, _ = store.enqueue("webhook", providers.webhook.url, {"text": "x"})
    providers.webhook.answers.extend([503] * 5)
    results = []
    for _ in range(5):
        results.append(_drain(svc))
        _due_now(svc)
    assert [r["deferredBackoff"] for r in results] == [1, 1, 1, 1, 0]
    assert results[-1] == {"recovered": 0, "failed": 0, "skippedMaxRetries": 1,
                           "deferredBackoff": 0}
    dead = store.get(entry.id)
    assert dead.status is DeliveryStatus.FAILED and dead.attempts == 5
    assert "gave up after 5 attempts" in (dead.last_error or "")
    assert len(providers.webhook.received) == 5
    assert run_job(get_job("delivery-drain"), svc, "cli").outcome == "ok", \
        "nothing left to fail in a later run"


def test_a_run_with_failures_is_reported_as_failures(svc: Services) -> None:
    DeliveryStore(svc.db).enqueue("sms", "+46", {"text": "x"})
    outcome = run_job(get_job("delivery-drain"), svc, "cli")
    assert outcome.outcome == "failures" and outcome.body["failed"] == 1


def test_the_drain_stops_before_its_deadline_and_counts_what_it_left(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    for i in range(3):
        store.enqueue("slack", "C0ALERTS", {"text": str(i)})
    with httpx.Client(timeout=5) as client:
        deliverer = Deliverer.from_services(svc, client)
        assert deliverer.send_timeout_s == 5
        result = deliverer.drain(Deadline(4.0))
    assert result == {"recovered": 0, "failed": 0, "skippedMaxRetries": 0, "deferredBackoff": 3}
    assert providers.slack.messages == [], "less than one send timeout left: nothing started"


def test_inline_delivery_is_write_ahead_and_a_repeated_key_is_not_resent(
        svc: Services, providers: Providers) -> None:
    with httpx.Client(timeout=5) as client:
        deliverer = Deliverer.from_services(svc, client)
        entry, outcome = deliverer.deliver("webhook", providers.webhook.url, {"text": "now"},
                                           idempotency_key="notice:7", subject_user_id="u7")
        again, second = deliverer.deliver("webhook", providers.webhook.url, {"text": "now"},
                                          idempotency_key="notice:7")
    assert outcome is AttemptOutcome.ACKED and entry.status is DeliveryStatus.ACKED
    assert entry.attempts == 1 and entry.subject_user_id == "u7"
    assert second is None and again.id == entry.id
    assert len(providers.webhook.received) == 1


def test_a_webhook_receiver_rejects_a_wrong_signature(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    env = {**providers.env(), "SLUICE_WEBHOOK_SIGNING_SECRET": "another-secret-0123456789"}
    services = make_services(db_url, **env)
    entry, _ = DeliveryStore(services.db).enqueue("webhook", providers.webhook.url, {"a": 1})
    result = _drain(services)
    assert providers.webhook.rejected == 1 and providers.webhook.received == []
    assert result["failed"] == 1, "401 is a 4xx that repeating cannot fix"
    assert "webhook answered 401" in (DeliveryStore(services.db).get(entry.id).last_error or "")


def test_an_unreachable_platform_is_transient_and_never_leaks_the_bot_token(
        db_url: str, make_services: Callable[..., Services]) -> None:
    token = "987654:SECRET-bot-token"
    services = make_services(db_url, SLUICE_TELEGRAM_BOT_TOKEN=token,
                             SLUICE_TELEGRAM_API_URL=f"http://127.0.0.1:{free_port()}",
                             SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS="2")
    entry, _ = DeliveryStore(services.db).enqueue("telegram", "1001", {"text": "x"})
    assert _drain(services)["deferredBackoff"] == 1
    stored = DeliveryStore(services.db).get(entry.id)
    assert stored.status is DeliveryStatus.PENDING and "ConnectError" in (stored.last_error or "")
    assert token not in json.dumps(stored.to_json())
