"""Facts of the seed-parity rows on push queues, the operations surface and the job queue
([jobs], [queue]) that the tests the rows named before did not show, and the numbers those
rows state, checked against the code."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.store.db import open_database
from tests.conftest import admin_token

SECRET = "queue-secret-for-parity-0123456789"


class _Taking:
    """A Slack adapter that takes every send (no network)."""

    name = "slack"

    def __init__(self) -> None:
        self.sent: list[str] = []

    def outage_key(self, entry: Any) -> str:
        return "slack:C0ALERTS"

    def send(self, entry: Any, progress: object = None) -> str:
        self.sent.append(entry.payload["text"])
        return f"ts-{len(self.sent)}"


# --- push queues [jobs] ------------------------------------------------------------------


def test_the_idempotency_key_keeps_the_first_96_utf16_units_of_the_json() -> None:
    from sluice.queues.keys import idempotency_key, js_prefix
    from sluice.queues.signing import js_stringify

    message = {"topic": "rss.ingest", "batchId": "b-1", "sourceId": "all-sources",
               "feedUrl": "https://example.com/" + "x" * 200, "signature": "s" * 64}
    key = idempotency_key(message)
    prefix = key.removeprefix("rss.ingest:b-1:")
    assert len(prefix) == 96 and js_prefix("x" * 200) == "x" * 96
    body = {k: v for k, v in message.items() if k != "signature"}
    assert prefix == "".join(c if c.isalnum() and c.isascii() else "_"
                             for c in js_stringify(body)[:96])


def _failing_consumer(services: Any, sleep: Any) -> tuple[Any, list[int]]:
    from sluice.queues.consumer import Consumer

    calls: list[int] = []

    def handler(message: dict[str, Any], inbound: Any) -> None:
        calls.append(inbound.delivery_count)
        raise RuntimeError("the handler fails")

    return Consumer("rss.ingest", handler, services, registry=None, sleep=sleep), calls


def test_in_process_the_five_attempts_run_back_to_back_then_dead_letter(
        sqlite_url: str, make_services: Any) -> None:
    from sluice.queues.consumer import MessageOutcome, backoff_s
    from sluice.queues.deadletters import LocalDeadLetters
    from sluice.queues.signing import Signer
    from sluice.queues.topics import MAX_ATTEMPTS

    services = make_services(sqlite_url, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    body = json.dumps(Signer([SECRET]).sign({"topic": "rss.ingest", "batchId": "b"}))
    # no sleep (what `sluice dev` builds): no wait between the attempts
    consumer, calls = _failing_consumer(services, None)
    started = time.monotonic()
    decision = consumer.deliver_local(body, "local-1")
    assert time.monotonic() - started < backoff_s(1)
    assert calls == list(range(1, MAX_ATTEMPTS + 1))
    assert decision.outcome is MessageOutcome.DEAD_LETTERED
    [summary] = [json.loads(r["summary"]) if isinstance(r["summary"], str) else r["summary"]
                 for r in LocalDeadLetters(services.db).list("rss.ingest", 10)]
    assert summary["deliveryCount"] == MAX_ATTEMPTS
    assert summary["errorMessage"] == "RuntimeError: the handler fails"
    # with a sleep given, the waits are the backoff's
    slept: list[float] = []
    consumer, calls = _failing_consumer(services, slept.append)
    consumer.deliver_local(json.dumps(Signer([SECRET]).sign(
        {"topic": "rss.ingest", "batchId": "c"})), "local-2")
    assert slept == [backoff_s(n) for n in range(1, MAX_ATTEMPTS)]


# --- the operations surface [jobs] -------------------------------------------------------


def test_each_role_lands_on_the_first_page_it_may_open(
        sqlite_url: str, make_services: Any) -> None:
    from sluice.http.app import create_app
    from sluice.http.console.pages import NAV, nav_surfaces

    # every page of the navigation is guarded by one surface, read from its own route
    assert [path for path, _ in nav_surfaces()] == [path for path, _ in NAV]
    client = TestClient(create_app(make_services(sqlite_url)))
    expected = {"ops": "/admin/queues", "super_admin": "/admin/queues",
                "privacy": "/admin/erasure", "billing": "/admin/queues"}
    for role, page in expected.items():
        cookie = {"cookie": f"__session={admin_token([role])}"}
        home = client.get("/admin", headers=cookie, follow_redirects=False)
        assert home.status_code == 303 and home.headers["location"] == page, role
        landed = client.get(page, headers=cookie)
        # billing's surfaces (metering, the ledger) have API routes and no page: the
        # overview's refusal names the roles it needs
        assert landed.status_code == (403 if role == "billing" else 200), role
    # no session, or one that does not verify: the overview, whose 401 says how to get one
    for headers in ({}, {"cookie": "__session=not-a-token"}):
        home = client.get("/admin", headers=headers, follow_redirects=False)
        assert home.headers["location"] == "/admin/queues"
        assert client.get("/admin/queues", headers=headers).status_code == 401


# --- the job queue [queue] ---------------------------------------------------------------


def test_last_error_is_cut_at_2000_characters() -> None:
    from sluice.delivery.classify import describe

    assert len(describe(RuntimeError("x" * 5000))) == 2000
    assert describe(RuntimeError("refused")) == "RuntimeError: refused"


def test_the_jitter_is_a_fraction_of_the_delay_and_the_first_wait_the_minimum() -> None:
    from sluice.delivery.retry import RetryPolicy

    policy = RetryPolicy(jitter=0.1)
    assert policy.delay(1, rng=lambda: 0.0) == pytest.approx(0.3)
    assert policy.delay(1, rng=lambda: 1.0) == pytest.approx(0.33)
    assert policy.delay(3, rng=lambda: 0.0) == pytest.approx(1.2)
    assert RetryPolicy().delay(20) == 30.0


def test_retrier_is_used_by_the_delivery_sends_only() -> None:
    import sluice

    root = Path(sluice.__file__).parent
    users = sorted(str(path.relative_to(root)) for path in root.rglob("*.py")
                   if "sluice.delivery.retry" in path.read_text()
                   or "from sluice.delivery import retry" in path.read_text())
    # the delivery package, and the extension API that hands it to an app's adapters
    assert users and all(user.startswith("delivery/") or user == "extend.py"
                         for user in users), users


def test_a_paused_destinations_entries_count_as_paused_not_in_backoff(sqlite_url: str) -> None:
    from sluice.delivery.destinations import Destinations
    from sluice.delivery.drain import Deliverer
    from sluice.delivery.store import DeliveryStore
    from sluice.jobs.registry import Deadline
    from sluice.store.db import utcnow

    db = open_database(sqlite_url)
    try:
        store, adapter = DeliveryStore(db), _Taking()
        deliverer = Deliverer(store, {"slack": adapter},
                              lease=timedelta(seconds=30))
        store.enqueue("slack", "C0ALERTS", {"text": "first"})
        assert deliverer.drain(Deadline(30))["recovered"] == 1  # the destination is known
        store.enqueue("slack", "C0ALERTS", {"text": "second"})
        assert Destinations(db, 3).pause("slack:C0ALERTS", utcnow() + timedelta(hours=1)) == 1
        time.sleep(0.01)
        summary = deliverer.drain(Deadline(30))
        # not in its backoff (no attempt failed): counted as waiting on the pause, not there
        assert (summary["deferredBackoff"], summary["paused"]) == (0, 1)
        assert adapter.sent == ["first"]
    finally:
        db.close()


def test_failed_entries_are_pruned_after_the_retention(sqlite_url: str) -> None:
    from sluice.core.settings import Settings
    from sluice.delivery.store import DeliveryStatus, DeliveryStore
    from sluice.store.db import utcnow

    days = Settings._field_defaults["delivery_retention_days"]
    assert days == 7
    db = open_database(sqlite_url)
    try:
        store = DeliveryStore(db)
        old = utcnow() - timedelta(days=days + 1)
        store.enqueue("telegram", "1001", {"text": "refused"}, now=old)
        [entry] = store.claim(timedelta(seconds=30), now=old)
        store.fail(entry, "Forbidden: bot was blocked by the user", now=old)
        assert store.get(entry.id).status is DeliveryStatus.FAILED
        assert store.prune(utcnow() - timedelta(days=days)) == 1
        assert store.list() == []
    finally:
        db.close()


def test_the_drain_stops_claiming_once_shutdown_has_begun(sqlite_url: str) -> None:
    from sluice.core.shutdown import SHUTDOWN
    from sluice.delivery.drain import Deliverer
    from sluice.delivery.store import DeliveryStore
    from sluice.jobs.registry import Deadline

    db = open_database(sqlite_url)
    try:
        store, adapter = DeliveryStore(db), _Taking()
        deliverer = Deliverer(store, {"slack": adapter},
                              lease=timedelta(seconds=30))
        for n in range(3):
            store.enqueue("slack", "C0ALERTS", {"text": f"m{n}"})
        SHUTDOWN.set()
        try:
            deliverer.drain(Deadline(30))
        finally:
            SHUTDOWN.clear()
        assert adapter.sent == [], "nothing is claimed after the abort"
    finally:
        db.close()


def test_last_error_adds_the_direct_cause_not_the_root() -> None:
    from sluice.delivery.classify import describe

    def chained() -> BaseException:
        try:
            try:
                raise OSError("connection reset")
            except OSError as root:
                raise TimeoutError("read timed out") from root
        except TimeoutError as cause:
            try:
                raise RuntimeError("slack: send failed") from cause
            except RuntimeError as error:
                return error

    text = describe(chained())
    assert text == "RuntimeError: slack: send failed (caused by TimeoutError: read timed out)"
    assert "connection reset" not in text, "the root, two levels down, is not added"


def test_the_dead_letter_error_message_is_the_typed_text_cut_at_500_code_points() -> None:
    from sluice.queues.consumer import ERROR_MESSAGE_LIMIT, InboundMessage, dead_letter_summary

    summary = dead_letter_summary({"batchId": "b"}, InboundMessage("m-1", "rss.ingest", 5),
                                  ValueError("\U0001f600" * 600), "2026-01-01T00:00:00.000Z")
    text = summary["errorMessage"]
    assert text.startswith("ValueError: ") and len(text) == ERROR_MESSAGE_LIMIT == 500
    assert len(text.encode("utf-16-le")) // 2 > 500, "JavaScript's length would be more"


def test_the_classifier_has_no_configuration_verdict() -> None:
    from sluice.core.errors import ConfigurationError
    from sluice.delivery.classify import classify

    assert classify(ConfigurationError("the SMTP host is not set")) == "transient"


def test_a_tenant_override_of_the_pipeline_flag_is_refused_and_never_read(
        sqlite_url: str, make_services: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.core.errors import RequestError
    from sluice.queues.consumer import InboundMessage
    from sluice.queues.handlers import PIPELINE_FLAG, ingest_handler
    from sluice.rss.store import RssStore
    from sluice.store.flags import FlagStore

    services = make_services(sqlite_url)
    RssStore(services.db).put_scope("acme", "tenant-acme", (), "en", True)
    flags = FlagStore(services.state, scope_exists=RssStore(services.db).has_scope)
    with pytest.raises(RequestError, match="would change nothing") as refused:
        flags.apply({"key": PIPELINE_FLAG, "enabled": True, "tenantScopeId": "acme"})
    assert refused.value.code == "override_not_honoured"
    assert flags.overrides(PIPELINE_FLAG) == {}
    flags.set(PIPELINE_FLAG, True, "acme")  # one stored before overrides were refused
    asked: list[str | None] = []
    read = FlagStore.enabled
    monkeypatch.setattr(FlagStore, "enabled", lambda self, key, tenant_scope_id=None: (
        asked.append(tenant_scope_id) or read(self, key, tenant_scope_id)))
    ingest_handler(services)({"batchId": "b-1", "sourceId": "all-sources", "feedUrl": ""},
                             InboundMessage("m-1", "rss.ingest", 1))
    assert asked == [None], "the consumer reads the flag globally: off, so no work"
    assert FlagStore(services.state).describe(PIPELINE_FLAG)["overridesTakeEffect"] is False


# --- deep re-audit of push queues, [queue] and [pipeline] ---------------------------------


def test_a_retry_after_past_the_in_process_maximum_waits_the_providers_time_not_the_schedule(
        ) -> None:
    from sluice.delivery.classify import TransientDeliveryError
    from sluice.delivery.policy import Attempt, DeliveryOutcome, Policy
    from sluice.delivery.retry import Retrier

    asked = TransientDeliveryError("telegram 429: Too Many Requests", retry_after_s=60)
    calls: list[int] = []

    def send() -> str:
        calls.append(1)
        raise asked

    with pytest.raises(TransientDeliveryError):
        Retrier(sleep=lambda seconds: None).call(send, label="t")
    assert calls == [1], "60 s is past the 30 s the retrier waits: not waited in process"
    policy = Policy()
    outcome = policy.after_send("transient", asked, channel="telegram", attempts=1,
                                unknown_sends=0)
    decision = policy.decide(outcome, attempts=1, wait=timedelta(seconds=60))
    # the queue holds it for the provider's 60 s (not the schedule's 5 s), no attempt counted
    assert outcome is DeliveryOutcome.PACING
    assert decision.delay == timedelta(seconds=60) != policy.schedule.step(1)
    assert decision.attempt is Attempt.GIVEN_BACK


class _Refusing(_Taking):
    """A Telegram adapter whose chat refuses every send with ``text``."""

    name = "telegram"

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def outage_key(self, entry: Any) -> str:
        return f"telegram:{entry.recipient}"

    def send(self, entry: Any, progress: object = None) -> str:
        from sluice.delivery.classify import PermanentDeliveryError

        raise PermanentDeliveryError(self.text, status=403)


def test_a_permanent_refusal_counts_failed_unless_it_says_the_destination_is_gone(
        sqlite_url: str) -> None:
    from sluice.delivery.drain import Deliverer
    from sluice.delivery.store import DeliveryStatus, DeliveryStore
    from sluice.jobs.registry import Deadline

    counted = {}
    db = open_database(sqlite_url)
    try:
        store = DeliveryStore(db)
        for chat, text in (("1001", "Bad Request: message is too long"),
                           ("1002", "Forbidden: bot was blocked by the user")):
            entry, _ = store.enqueue("telegram", chat, {"text": "x"})
            summary = Deliverer(store, {"telegram": _Refusing(text)},
                                lease=timedelta(seconds=30)).drain(Deadline(30))
            assert store.get(entry.id).status is DeliveryStatus.FAILED
            counted[text] = (summary["failed"], summary["failedDisabled"])
    finally:
        db.close()
    assert counted == {"Bad Request: message is too long": (1, 0),
                       "Forbidden: bot was blocked by the user": (0, 1)}


def test_a_final_4xx_without_a_pattern_is_permanent() -> None:
    from sluice.delivery.channels.base import refused
    from sluice.delivery.classify import CredentialsRefused, classify, matches_permanent

    for status in (400, 404, 413, 422):
        text = f"webhook answered {status}: no"
        assert not matches_permanent(text)
        assert classify(refused(text, status=status)) == "permanent", status
    assert classify(refused("telegram 400: Bad Request: message to be replied not found",
                            status=400)) == "permanent"
    for status in (408, 409, 425, 429, 500, 503):
        assert classify(refused(f"webhook answered {status}: later", status=status)) == \
            "transient", status
    assert isinstance(refused("webhook answered 403: no", status=403), CredentialsRefused)


def test_the_stored_last_error_of_an_entry_given_up_runs_past_the_describe_cut(
        sqlite_url: str) -> None:
    from sluice.delivery.classify import describe
    from sluice.delivery.store import DeliveryStatus, DeliveryStore
    from sluice.store.db import utcnow

    db = open_database(sqlite_url)
    try:
        store = DeliveryStore(db)
        entry, _ = store.enqueue("slack", "C1", {"text": "x"})
        now = utcnow()
        error = describe(RuntimeError("x" * 5000))
        for _ in range(5):
            [claimed] = store.claim(timedelta(seconds=30), now=now)
            store.nack(claimed, error, now=now)
            now += timedelta(hours=1)
        failed = store.get(entry.id)
        assert failed.status is DeliveryStatus.FAILED and len(error) == 2000
        assert failed.last_error == f"gave up after 5 attempts; last error: {error}"
    finally:
        db.close()


def test_the_seven_patterns_of_the_pipeline_are_permanent_in_any_case() -> None:
    from sluice.delivery.classify import matches_permanent

    seven = ("chat not found", "user not found", "bot was blocked", "forbidden: bot was kicked",
             "chat_id is empty", "no conversation reference found", "ambiguous.*recipient")
    for pattern in seven:
        text = pattern.replace(".*", " for this ")
        assert matches_permanent(text) and matches_permanent(text.upper()), pattern
    # a kick worded without "Forbidden:" is permanent too
    assert matches_permanent("Bad Request: bot was kicked from the supergroup chat")
    assert not matches_permanent("connection reset by peer")
