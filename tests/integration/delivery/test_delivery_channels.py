"""The adapters against local stand-ins speaking each platform's documented shapes, and the
delivery-drain job end to end on both backends. In-process retries sleep through
``drain.SLEEP``, replaced here by a recorder: no test waits for real."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

from sluice.core.services import Services
from sluice.delivery.channels import Outbound
from sluice.delivery.drain import Deliverer, SendOutcome
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.jobs.registry import Deadline, get_job
from sluice.jobs.runner import run_job
from sluice.store.db import utcnow
from tests.conftest import free_port
from tests.integration.delivery.helpers import Providers, drain_once, due_now, seed


def test_the_drain_delivers_to_every_channel(svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    hook, _ = store.enqueue("webhook", providers.webhook.url, {"alert": "cpu", "text": "hot"},
                            idempotency_key="alert:cpu:1")
    store.enqueue("slack", "C0ALERTS", {"text": "slack hello"})
    store.enqueue("telegram", "1001", {"text": "telegram hello", "silent": True})
    mail, _ = store.enqueue("email", "ops@example.com",
                            {"subject": "Alert", "text": "plain", "html": "<b>html</b>"})

    result = drain_once(svc)

    assert seed(result) == {"recovered": 4, "failed": 0, "skippedMaxRetries": 0,
                            "deferredBackoff": 0}
    [received] = providers.webhook.received
    assert received["key"] == "alert:cpu:1" and received["body"] == {"alert": "cpu",
                                                                      "text": "hot"}
    assert received["headers"]["webhook-id"] == "alert:cpu:1" == hook.dedupe_key
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


def test_permanent_errors_fail_at_once_with_their_reason_without_retrying(
        svc: Services, providers: Providers, sleeps: list[float]) -> None:
    store = DeliveryStore(svc.db)
    cases = {
        ("telegram", "999"): "telegram 400: Bad Request: chat not found",
        ("telegram", "1002"): "telegram 403: Forbidden: bot was blocked by the user",
        ("slack", "C0NOPE"): "slack: channel_not_found",
        ("slack", "C0OLD"): "slack: is_archived",
        ("email", "gone@example.com"): "email: recipient address rejected: 550 5.1.1 user unknown",
        ("webhook", providers.webhook.http.url + "/nowhere"): "webhook answered 404",
    }
    for channel, recipient in cases:
        store.enqueue(channel, recipient, {"text": "x"})

    result = drain_once(svc)

    # a refusal that says the chat or channel itself is gone disables that destination too
    gone = {("telegram", "999"), ("telegram", "1002"), ("slack", "C0NOPE"), ("slack", "C0OLD")}
    assert seed(result) == {"recovered": 0, "failed": 2, "skippedMaxRetries": 0,
                            "deferredBackoff": 0}
    assert result["failedDisabled"] == 4
    assert sorted(result["disabled"]) == sorted(f"{c}:{r}" for c, r in gone)
    failed = {(e.channel, e.recipient): e for e in store.list(status=DeliveryStatus.FAILED)}
    for key, reason in cases.items():
        assert reason in (failed[key].last_error or ""), failed[key].last_error
        assert failed[key].attempts == 1 and failed[key].failure_reason == (
            "destination_disabled" if key in gone else "permanent")
    assert sleeps == [], "a permanent refusal is never retried in-process"
    assert drain_once(svc)["failed"] == 0, "a failed entry is never tried again"


def test_a_channel_without_adapter_waits_pending_and_is_reported_not_failed(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    # GIVEN a deployment whose Telegram token never arrived
    env = {k: v for k, v in providers.env().items() if "TELEGRAM" not in k}
    unconfigured = make_services(db_url, **env)
    store = DeliveryStore(unconfigured.db)
    entry, _ = store.enqueue("telegram", "1001", {"text": "hello"})
    store.enqueue("slack", "C0ALERTS", {"text": "still sent"})

    # WHEN the drain runs (twice)
    outcome = run_job(get_job("delivery-drain"), unconfigured, "cli")
    again = run_job(get_job("delivery-drain"), unconfigured, "cli")

    # THEN the entry waits, no attempt counted, and each run says why
    assert outcome.outcome == "ok" and seed(outcome.body) == {
        "recovered": 1, "failed": 0, "skippedMaxRetries": 0, "deferredBackoff": 0}
    assert outcome.body["unconfigured"] == {
        "count": 1, "channels": {"telegram": "no adapter configured for channel 'telegram'"}}
    assert again.body["unconfigured"]["count"] == 0, "set aside until after the run ended"
    waiting = store.get(entry.id)
    assert waiting.status is DeliveryStatus.PENDING and waiting.attempts == 0
    assert "no adapter configured for channel 'telegram'" in (waiting.last_error or "")

    # AND once the credential is configured, it is delivered on its first attempt
    due_now(unconfigured)
    configured = make_services(db_url, **providers.env())
    assert drain_once(configured)["recovered"] == 1
    delivered = store.get(entry.id)
    assert delivered.status is DeliveryStatus.ACKED and delivered.attempts == 1
    assert [m["text"] for m in providers.telegram.messages] == ["hello"]


def test_short_blips_are_retried_in_process_honouring_retry_after(
        svc: Services, providers: Providers, sleeps: list[float]) -> None:
    store = DeliveryStore(svc.db)
    # waits within SLUICE_DELIVERY_RATE_WAIT_SECONDS (1 s): a send waits them in process
    providers.telegram.flood_wait.append(1)
    providers.webhook.answers.append(503)
    providers.slack.answers.append((429, {"ok": False, "error": "ratelimited"},
                                    {"retry-after": "1"}))
    for channel, recipient in (("telegram", "1001"), ("webhook", providers.webhook.url),
                               ("slack", "C0ALERTS")):
        store.enqueue(channel, recipient, {"text": f"to {channel}"})

    result = drain_once(svc)

    assert seed(result) == {"recovered": 3, "failed": 0, "skippedMaxRetries": 0,
                            "deferredBackoff": 0}
    assert sleeps == [1.0, 0.3, 1.0], "Retry-After when longer than the policy's 300 ms"
    assert {e.attempts for e in store.list()} == {1}, "one queue attempt each"
    assert len(providers.webhook.received) == 2


def test_transient_errors_past_the_in_process_retries_wait_out_the_schedule(
        svc: Services, providers: Providers, sleeps: list[float]) -> None:
    store = DeliveryStore(svc.db)
    providers.telegram.flood_wait.extend([120])  # past the run's budget: not waited
    providers.webhook.answers.extend([503] * 3)
    providers.slack.answers.extend([(429, {"ok": False, "error": "ratelimited"},
                                     {"retry-after": "90"})])
    for channel, recipient in (("telegram", "1001"), ("webhook", providers.webhook.url),
                               ("slack", "C0ALERTS"), ("email", "busy@example.com")):
        store.enqueue(channel, recipient, {"text": f"to {channel}"})
    started = utcnow()

    first = drain_once(svc)

    assert seed(first) == {"recovered": 0, "failed": 0, "skippedMaxRetries": 0,
                           "deferredBackoff": 0}, "attempted this run: not deferred"
    # a provider's wait past SLUICE_DELIVERY_RATE_WAIT_SECONDS is never slept in process:
    # the webhook's 503 and the relay's 451 are retried twice each, the waits not at all
    assert len(sleeps) == 4, "three tries each for the answers that name no wait"
    assert first["rateLimited"] == 2
    waits = {e.channel: (e.next_attempt_at - started).total_seconds()
             for e in store.list(status=DeliveryStatus.PENDING)}
    assert 120 <= waits["telegram"] < 125, "Telegram's retry_after, its attempt given back"
    assert 90 <= waits["slack"] < 95, "Slack's Retry-After too"
    assert 5 <= waits["webhook"] < 10 and 5 <= waits["email"] < 10, "the schedule's 5 s"
    assert "retry after 120" in (store.list(channel="telegram")[0].last_error or "")
    attempts = {e.channel: e.attempts for e in store.list()}
    assert attempts == {"telegram": 0, "slack": 0, "webhook": 1, "email": 1}, \
        "a provider's pacing costs nothing; an answered failure is its entry's own"
    second = drain_once(svc)
    assert second["deferredBackoff"] == 4, "not due yet: skipped because in backoff"
    assert second["leftDue"] == 0

    providers.smtp.busy.clear()
    due_now(svc)
    with svc.db.transaction() as tx:  # the providers' waits have passed for the rates too
        tx.execute("DELETE FROM delivery_rate_limits")
    third = drain_once(svc)
    assert seed(third) == {"recovered": 4, "failed": 0, "skippedMaxRetries": 0,
                           "deferredBackoff": 0}
    assert {e.channel: e.attempts for e in store.list()} == {
        "telegram": 1, "slack": 1, "webhook": 2, "email": 2}


def test_a_receiver_answering_every_attempt_fails_its_lone_entry_after_five(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    entry, _ = store.enqueue("webhook", providers.webhook.url, {"text": "x"})
    providers.webhook.answers.extend([503] * 100)
    results = []
    for _ in range(6):
        results.append(drain_once(svc))
        due_now(svc)
    assert [r["skippedMaxRetries"] for r in results] == [0, 0, 0, 0, 1, 0]
    failed = store.get(entry.id)
    assert (failed.status, failed.failure_reason, failed.attempts) == (
        DeliveryStatus.FAILED, "max_attempts", 5)
    assert len(providers.webhook.received) == 15, "5 attempts, 3 in-process tries each"
    assert results[-1]["outages"]["destinations"] == [], "answered: never held"


def test_a_receiver_never_reached_holds_its_entry_until_it_expires(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    port = free_port()  # nobody listens: every connection is refused
    entry, _ = store.enqueue("webhook", f"http://127.0.0.1:{port}/hook", {"text": "x"})
    results = []
    for _ in range(6):
        results.append(drain_once(svc))
        due_now(svc)
    assert [r["skippedMaxRetries"] + r["failed"] for r in results] == [0] * 6
    held = store.get(entry.id)
    assert held.status is DeliveryStatus.PENDING and held.attempts == 0
    [down] = results[-1]["outages"]["destinations"]
    assert down["key"] == f"webhook:127.0.0.1:{port}"
    assert down["down"] and down["failures"] == 6 and down["waiting"] == 1
    with svc.db.transaction() as tx:  # a day passes
        tx.execute("UPDATE delivery_queue SET enqueued_at = :t", {"t": utcnow() - timedelta(
            days=2)})
    assert drain_once(svc)["expired"] == 1
    assert store.get(entry.id).failure_reason == "expired"


def test_a_run_with_failures_is_reported_as_failures(svc: Services,
                                                    providers: Providers) -> None:
    providers.webhook.answers.append(422)  # the message refused for good, not the host
    DeliveryStore(svc.db).enqueue("webhook", providers.webhook.url, {"text": "x"})
    outcome = run_job(get_job("delivery-drain"), svc, "cli")
    assert outcome.outcome == "failures" and outcome.body["failed"] == 1


def test_a_run_that_disables_a_destination_pages_once_not_as_failures(svc: Services) -> None:
    DeliveryStore(svc.db).enqueue("telegram", "999", {"text": "x"})  # chat not found
    outcome = run_job(get_job("delivery-drain"), svc, "cli")
    assert outcome.outcome == "ok" and outcome.body["failed"] == 0
    assert list(outcome.body["disabled"]) == ["telegram:999"]
    assert "chat not found" in outcome.body["disabled"]["telegram:999"]


def test_the_drain_stops_before_its_deadline_and_counts_what_it_left(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    for i in range(3):
        store.enqueue("slack", "C0ALERTS", {"text": str(i)})
    with Outbound.open(svc.settings) as client:
        deliverer = Deliverer.from_services(svc, client)
        assert deliverer.send_timeout_s == 5
        result = deliverer.drain(Deadline(4.0))
    assert seed(result) == {"recovered": 0, "failed": 0, "skippedMaxRetries": 0,
                            "deferredBackoff": 0}, "due, not in backoff"
    assert result["leftDue"] == 3
    assert providers.slack.messages == [], "less than one send timeout left: nothing started"


def test_inline_delivery_is_write_ahead_and_a_repeated_key_is_not_resent(
        svc: Services, providers: Providers) -> None:
    with Outbound.open(svc.settings) as client:
        deliverer = Deliverer.from_services(svc, client)
        entry, outcome = deliverer.deliver("webhook", providers.webhook.url, {"text": "now"},
                                           idempotency_key="notice:7", subject_user_id="u7")
        again, second = deliverer.deliver("webhook", providers.webhook.url, {"text": "now"},
                                          idempotency_key="notice:7")
    assert outcome is SendOutcome.ACKED and entry.status is DeliveryStatus.ACKED
    assert entry.attempts == 1 and entry.subject_user_id == "u7"
    assert second is None and again.id == entry.id
    assert len(providers.webhook.received) == 1


def test_a_webhook_receiver_rejects_a_wrong_signature(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    env = {**providers.env(), "SLUICE_WEBHOOK_SIGNING_SECRET": "another-secret-0123456789"}
    services = make_services(db_url, **env)
    entry, _ = DeliveryStore(services.db).enqueue("webhook", providers.webhook.url, {"a": 1})
    result = drain_once(services)
    assert providers.webhook.rejected == 1 and providers.webhook.received == []
    # a refused signature is Sluice's configuration, not the entry: it waits, uncounted
    assert result["failed"] == 0 and result["outages"]["count"] == 1
    stored = DeliveryStore(services.db).get(entry.id)
    assert stored.status is DeliveryStatus.PENDING and stored.attempts == 0
    assert "webhook answered 401" in (stored.last_error or "")


def test_an_unreachable_platform_is_transient_and_never_leaks_the_bot_token(
        db_url: str, make_services: Callable[..., Services]) -> None:
    token = "987654:SECRET-bot-token"
    services = make_services(db_url, SLUICE_TELEGRAM_BOT_TOKEN=token,
                             SLUICE_TELEGRAM_API_URL=f"http://127.0.0.1:{free_port()}",
                             SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS="2")
    entry, _ = DeliveryStore(services.db).enqueue("telegram", "1001", {"text": "x"})
    assert seed(drain_once(services)) == {"recovered": 0, "failed": 0, "skippedMaxRetries": 0,
                                      "deferredBackoff": 0}
    stored = DeliveryStore(services.db).get(entry.id)
    assert stored.status is DeliveryStatus.PENDING and "ConnectError" in (stored.last_error or "")
    assert stored.attempts == 0, "the platform is unreachable: the entry waits, uncounted"
    assert token not in json.dumps(stored.to_json())


def test_telegram_sends_media_as_the_flags_ask(svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    store.enqueue("telegram", "1001", {"mediaUrl": "https://cdn.test/a.gif", "gifPlayback": True,
                                       "text": "caption after"})
    store.enqueue("telegram", "1001", {"mediaUrl": "https://cdn.test/b.png",
                                       "gifPlayback": True, "forceDocument": True})
    store.enqueue("telegram", "1001", {"mediaUrl": "https://cdn.test/c.png", "mirror": True})
    assert seed(drain_once(svc))["recovered"] == 3
    sent = sorted((m.get("method", "sendMessage"), m.get("animation") or m.get("document")
                   or m.get("photo") or m.get("text")) for m in providers.telegram.messages)
    assert sent == [("sendAnimation", "https://cdn.test/a.gif"),
                    ("sendDocument", "https://cdn.test/b.png"),
                    ("sendMessage", "caption after"),
                    ("sendPhoto", "https://cdn.test/c.png")]
