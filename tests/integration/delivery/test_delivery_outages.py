"""What is not an entry's fault never costs it an attempt: a channel or host outage, a
send whose answer never came (unknown, retried with the same key), the process running
out of memory. And what is never delivered expires as failed, never deleted. Both
backends, real stand-ins."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.delivery.channels import Outbound
from sluice.delivery.channels.base import NO_PROGRESS, Progress
from sluice.delivery.drain import Deliverer, report_drained
from sluice.delivery.store import DeliveryEntry, DeliveryStatus, DeliveryStore
from sluice.jobs.registry import Deadline, get_job
from sluice.ops.deadletters import DeadLetters
from sluice.store.db import utcnow
from tests.integration.delivery.helpers import Providers, drain_once, due_now, seed


def test_a_receiver_outage_holds_its_entries_and_counts_no_attempt(
        svc: Services, providers: Providers, sleeps: list[float]) -> None:
    # GIVEN a webhook receiver that answers 503 to everything, and a healthy Slack
    store = DeliveryStore(svc.db)
    providers.webhook.answers.extend([503] * 100)
    hooks = [store.enqueue("webhook", providers.webhook.url, {"text": str(i)})[0]
             for i in range(6)]
    store.enqueue("slack", "C0ALERTS", {"text": "unaffected"})

    # WHEN the drain runs
    result = drain_once(svc)

    # THEN a second entry failing holds the host: nothing more is sent to it, and none of
    # the six entries lost an attempt (the first one's is given back when the second fails)
    assert seed(result) == {"recovered": 1, "failed": 0, "skippedMaxRetries": 0,
                            "deferredBackoff": 0}
    assert result["outages"]["down"] == {}
    assert result["outages"]["count"] == 5, "the second, and the rest of its claim, set aside"
    assert len(providers.webhook.received) == 6, "two entries' 3 in-process tries, then stop"
    for entry in hooks:
        stored = store.get(entry.id)
        assert stored.status is DeliveryStatus.PENDING and stored.attempts == 0
    [held] = result["outages"]["destinations"]
    assert held["key"].startswith("webhook:127.0.0.1:") and held["waiting"] == 6

    # AND a whole outage longer than five runs fails nothing; from the third failed probe
    # in a row the host is reported down, with its waiting entries
    for _ in range(6):
        due_now(svc)
        again = drain_once(svc)
        assert again["failed"] == 0 and again["skippedMaxRetries"] == 0
    [(key, reason)] = again["outages"]["down"].items()
    assert key.startswith("webhook:127.0.0.1:") and "6 entries waiting" in reason
    assert {store.get(e.id).attempts for e in hooks} == {0}

    # AND once the receiver is back, everything is delivered on its first counted attempt
    providers.webhook.answers.clear()
    due_now(svc)
    back = drain_once(svc)
    assert back["recovered"] == 6 and back["outages"]["destinations"] == []
    assert {store.get(e.id).attempts for e in hooks} == {1}


@pytest.mark.parametrize("status", [401, 403])
def test_a_receiver_refusing_our_credentials_fails_nothing(
        svc: Services, providers: Providers, sleeps: list[float], status: int) -> None:
    # GIVEN a webhook receiver that refuses Sluice's signature (a rotated or wrong secret)
    store = DeliveryStore(svc.db)
    providers.webhook.answers.extend([status] * 100)
    hooks = [store.enqueue("webhook", providers.webhook.url, {"text": str(i)})[0]
             for i in range(5)]

    # WHEN the drain runs more often than the attempt limit
    for _ in range(6):
        due_now(svc)
        result = drain_once(svc)
        # THEN the refusal is configuration, not the entries' fault: nothing fails for good
        assert result["failed"] == 0 and result["skippedMaxRetries"] == 0

    assert {store.get(e.id).status for e in hooks} == {DeliveryStatus.PENDING}
    assert {store.get(e.id).attempts for e in hooks} == {0}

    # AND once the credential is fixed, every entry is delivered
    providers.webhook.answers.clear()
    due_now(svc)
    assert drain_once(svc)["recovered"] == 5


def test_a_failure_after_a_success_in_the_same_run_is_the_entrys_own(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    providers.webhook.answers.extend([200, 503, 503, 503])  # the second entry's three tries
    first, _ = store.enqueue("webhook", providers.webhook.url, {"text": "a"})
    second, _ = store.enqueue("webhook", providers.webhook.url, {"text": "b"})

    result = drain_once(svc)

    assert result["outages"] == {"count": 0, "down": {}, "destinations": []}
    assert result["recovered"] == 1
    assert store.get(first.id).status is DeliveryStatus.ACKED
    stored = store.get(second.id)
    assert stored.status is DeliveryStatus.PENDING and stored.attempts == 1, "counted"


@pytest.fixture
def slow_svc(db_url: str, providers: Providers,
             make_services: Callable[..., Services]) -> Iterator[Services]:
    yield make_services(db_url, **{**providers.env(),
                                   "SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS": "0.5"})
    providers.webhook.release.set()


def test_a_timeout_after_sending_is_unknown_never_retried_in_process(
        slow_svc: Services, providers: Providers) -> None:
    # GIVEN a receiver that takes the first request but answers too late
    providers.webhook.slow = 1
    store = DeliveryStore(slow_svc.db)
    entry, _ = store.enqueue("webhook", providers.webhook.url, {"text": "x"},
                             idempotency_key="alert:slow:1")

    # WHEN the drain runs: the outcome is unknown, counted, and not resent in this run
    result = drain_once(slow_svc)
    assert result["unknown"] == 1 and result["recovered"] == 0
    assert len(providers.webhook.received) == 1
    assert store.get(entry.id).status is DeliveryStatus.PENDING, "a webhook deduplicates"

    # THEN the next run resends it with the same key, and the receiver acts on it once
    due_now(slow_svc)
    assert drain_once(slow_svc)["recovered"] == 1
    assert [r["key"] for r in providers.webhook.received] == ["alert:slow:1"] * 2
    assert list(providers.webhook.delivered) == ["alert:slow:1"]
    assert store.get(entry.id).status is DeliveryStatus.ACKED


def test_an_unknown_outcome_at_the_attempt_limit_rests_unknown(
        slow_svc: Services, providers: Providers) -> None:
    providers.webhook.slow = 3
    store = DeliveryStore(slow_svc.db)
    entry, _ = store.enqueue("webhook", providers.webhook.url, {"text": "x"})
    with slow_svc.db.transaction() as tx:  # four attempts already used
        tx.execute("UPDATE delivery_queue SET attempts = 4 WHERE id = :id", {"id": entry.id})

    result = drain_once(slow_svc)

    assert result["unknown"] == 1 and result["skippedMaxRetries"] == 0
    stored = store.get(entry.id)
    assert stored.status is DeliveryStatus.UNKNOWN and stored.attempts == 5
    assert "sent; no answer" in (stored.last_error or "")
    due_now(slow_svc)
    assert drain_once(slow_svc)["unknown"] == 0, "never claimed again"
    assert len(providers.webhook.received) == 1


def test_an_entry_not_delivered_in_time_expires_as_failed_and_stays_visible(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    old, _ = store.enqueue("telegram", "1001", {"text": "stale"},
                           now=utcnow() - timedelta(seconds=86401))
    with svc.db.transaction() as tx:
        tx.execute("UPDATE delivery_queue SET last_error = 'telegram 429: slow down' "
                   "WHERE id = :id", {"id": old.id})
    fresh, _ = store.enqueue("telegram", "1001", {"text": "fresh"})

    result = drain_once(svc)

    assert result["expired"] == 1 and result["failed"] == 1 and result["recovered"] == 1
    expired = store.get(old.id)
    assert expired.status is DeliveryStatus.FAILED and expired.failure_reason == "expired"
    assert expired.last_error == ("expired: not delivered within 86400 s; "
                                  "last error: telegram 429: slow down")
    assert [m["text"] for m in providers.telegram.messages] == ["fresh"], "never sent"
    letters = DeadLetters(svc).list_letters("delivery")
    assert [(i["id"], i["reason"][:8]) for i in letters["items"]] == [(old.id, "expired:")]
    assert store.get(fresh.id).status is DeliveryStatus.ACKED


class OutOfMemory:
    """An adapter whose send exhausts memory (what a huge payload does to a small Lambda)."""

    name = "webhook"

    def __init__(self) -> None:
        self.sent: list[str] = []

    def outage_key(self, entry: DeliveryEntry) -> str:
        return "webhook"

    def send(self, entry: DeliveryEntry, progress: Progress = NO_PROGRESS) -> str:
        self.sent.append(entry.id)
        raise MemoryError()


class Recording(Reporter):
    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []
        self.recorded: list[tuple[dict[str, float], dict[str, str]]] = []

    def error(self, context: str, exc: BaseException | None = None, **extra: object) -> None:
        self.errors.append(f"{context}: {type(exc).__name__}")

    def metrics(self, values: dict[str, float], unit: str = "Count", **dims: str) -> None:
        self.recorded.append((values, dims))


def test_out_of_memory_stops_the_run_and_leaves_the_entry_pending(svc: Services) -> None:
    store = DeliveryStore(svc.db)
    first, _ = store.enqueue("webhook", "http://127.0.0.1:9/a", {"text": "a"})
    second, _ = store.enqueue("webhook", "http://127.0.0.1:9/b", {"text": "b"})
    adapter, reporter = OutOfMemory(), Recording()
    deliverer = Deliverer(store, {"webhook": adapter}, lease=timedelta(seconds=60),
                          send_timeout_s=1, reporter=reporter)

    result = deliverer.drain(Deadline(30))

    assert result["fatal"] == 1 and result["fatalError"] == "MemoryError"
    assert adapter.sent == [first.id], "the run stopped at the first"
    assert reporter.errors == ["delivery-drain: MemoryError"]
    for entry in (first, second):
        stored = store.get(entry.id)
        assert stored.status is DeliveryStatus.PENDING and stored.attempts == 0
    assert seed(result) == {"recovered": 0, "failed": 0, "skippedMaxRetries": 0,
                            "deferredBackoff": 0}
    assert get_job("delivery-drain").failures(dict(result)) == 1, "reported as a failure"


def test_each_drain_emits_queue_drained_with_its_summary(svc: Services,
                                                         providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    store.enqueue("slack", "C0ALERTS", {"text": "x"})
    reporter = Recording()
    with Outbound.open(svc.settings) as client:
        summary = Deliverer.from_services(svc, client).drain(Deadline(30))
    report_drained(summary, reporter)
    [(values, dims)] = reporter.recorded
    assert dims == {"event": "queue_drained"}
    assert values["QueueDrained.recovered"] == 1.0
    assert {"QueueDrained.failed", "QueueDrained.skippedMaxRetries",
            "QueueDrained.deferredBackoff", "QueueDrained.outages"} <= set(values)


def test_one_poisoned_entry_among_good_ones_fails_alone(
        svc: Services, providers: Providers) -> None:
    # GIVEN a webhook recipient that does not parse and an email recipient with CR/LF,
    # stored before any check, among good entries
    store = DeliveryStore(svc.db)
    good = [store.enqueue("webhook", providers.webhook.url, {"text": "a"})[0]]
    bad_hook, _ = store.enqueue("webhook", "http://[::1/x", {"text": "poison"})
    bad_mail, _ = store.enqueue("email", "ops@example.com\r\nBcc: x@example.com",
                                {"text": "poison"})
    good += [store.enqueue("email", "ops@example.com", {"text": "b"})[0],
             store.enqueue("slack", "C0ALERTS", {"text": "c"})[0]]

    # WHEN the drain runs
    result = drain_once(svc)

    # THEN each poisoned entry is its own permanent failure, the SMTP server is not held,
    # and every good entry is delivered in the same run
    assert result["recovered"] == 3 and result["failed"] == 2
    assert result["outages"] == {"count": 0, "down": {}, "destinations": []}
    for entry in (bad_hook, bad_mail):
        stored = store.get(entry.id)
        assert stored.status is DeliveryStatus.FAILED and stored.failure_reason == "permanent"
        assert stored.attempts == 1
    assert {store.get(e.id).status for e in good} == {DeliveryStatus.ACKED}
    assert len(providers.smtp.messages) == 1
