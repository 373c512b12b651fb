"""The delivery queue's behaviours the reference documents describe ([queue], [pipeline]),
each through the ``delivery-drain`` job (``run_job``) against the local receiver stand-ins,
on SQLite and Postgres: docs/seed-parity.md names these tests in its rows.

The drains here wait their in-process retries for real (0.3 s, then 0.6 s): this module's
``sleeps`` replaces the directory's recorder of those waits, so nothing of the drain is
swapped out, and what a test counts is what the receivers were sent."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from sluice.core.services import Services
from sluice.core.shutdown import SHUTDOWN
from sluice.delivery.store import DeliveryEntry, DeliveryStatus, DeliveryStore
from sluice.jobs.registry import get_job
from sluice.jobs.runner import RunOutcome, run_job
from sluice.ops.destinations import apply, parse_change
from sluice.store.db import utcnow
from tests.conftest import free_port
from tests.integration.delivery.helpers import WEBHOOK_SECRET, Providers, due_now
from tests.providers.telegram import MAX_TEXT as TELEGRAM_MAX
from tests.providers.webhook import WebhookReceiver


@pytest.fixture(autouse=True)
def sleeps() -> None:
    """In-process retry waits are slept for real in this module (see the docstring)."""


class Logged(logging.Handler):
    """The ``sluice`` logger's records while a test runs."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, pattern: str) -> list[logging.LogRecord]:
        return [r for r in self.records if re.search(pattern, r.getMessage())]


@pytest.fixture
def logged() -> Iterator[Logged]:
    handler, log = Logged(), logging.getLogger("sluice")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def drain(svc: Services) -> RunOutcome:
    """One scheduled run of the delivery-drain job."""
    outcome = run_job(get_job("delivery-drain"), svc, "schedule")
    assert outcome.status == 200, outcome.body
    return outcome


def hook(providers: Providers, name: str) -> str:
    return f"{providers.webhook.http.url}/hooks/{name}"


def requests_to(providers: Providers, name: str) -> int:
    return sum(1 for r in providers.webhook.received if r["path"] == f"/hooks/{name}")


def telegram_error(code: int, description: str) -> tuple[int, dict[str, Any]]:
    return code, {"ok": False, "error_code": code, "description": description}


def test_a_lone_entry_its_receiver_answers_500_waits_the_tiers_then_fails_and_pages(
        svc: Services, providers: Providers, logged: Logged) -> None:
    store = DeliveryStore(svc.db)
    providers.webhook.scripts["/hooks/lone"] = [500] * 15
    entry, _ = store.enqueue("webhook", hook(providers, "lone"), {"text": "disk full"})
    quiet, _ = store.enqueue("webhook", hook(providers, "paused"), {"text": "later"})
    until = (utcnow() + timedelta(hours=1)).isoformat()
    apply(svc, parse_change("pause", f"webhook:{hook(providers, 'paused')}", {"until": until}))

    for attempt, step_s in enumerate((5, 25, 120, 600), start=1):
        before = utcnow()
        outcome = drain(svc)
        after = utcnow()
        # a transient error of its own: the attempt counts, the error is kept, and the
        # entry is saved pending until the tier's wait has passed
        retried = store.get(entry.id)
        assert (retried.status, retried.attempts) == (DeliveryStatus.PENDING, attempt)
        assert "webhook answered 500" in (retried.last_error or "")
        assert before + timedelta(seconds=step_s) <= retried.next_attempt_at
        assert retried.next_attempt_at <= after + timedelta(seconds=step_s)
        assert outcome.outcome == "ok" and outcome.body["skippedMaxRetries"] == 0
        assert requests_to(providers, "lone") == 3 * attempt, "three tries in process each"
        # before its wait has passed the next run leaves it alone, counted in its backoff
        waiting = drain(svc).body
        assert (waiting["deferredBackoff"], waiting["paused"]) == (1, 1)
        assert requests_to(providers, "lone") == 3 * attempt
        due_now(svc)

    fifth = drain(svc)

    failed = store.get(entry.id)
    assert (failed.status, failed.failure_reason, failed.attempts) == (
        DeliveryStatus.FAILED, "max_attempts", 5)
    assert (failed.last_error or "").startswith("gave up after 5 attempts; last error: ")
    assert fifth.body["skippedMaxRetries"] == 1 and fifth.body["failed"] == 0
    assert fifth.outcome == "failures", "skippedMaxRetries is one of the drain's failure keys"
    assert logged.messages(r"\[delivery-drain\] drain reported 1 failure"), "it pages"
    assert [e.id for e in store.list(status=DeliveryStatus.FAILED)] == [entry.id]
    assert fifth.body["outages"]["destinations"] == [], "answered: its receiver never held"
    due_now(svc)
    assert drain(svc).body["skippedMaxRetries"] == 0
    assert requests_to(providers, "lone") == 15, "failed: never tried again"
    assert store.get(quiet.id).status is DeliveryStatus.PENDING


def test_each_entry_is_written_before_its_send_and_acked_nacked_or_failed_after_it(
        svc: Services, providers: Providers, logged: Logged) -> None:
    store = DeliveryStore(svc.db)
    providers.webhook.scripts["/hooks/flaky"] = [503] * 3
    providers.slack.answers.append((200, {"ok": False, "error": "msg_too_long"}, {}))
    acked, _ = store.enqueue("telegram", "1001", {"text": "ok"})
    nacked, _ = store.enqueue("webhook", hook(providers, "flaky"), {"text": "later"})
    failed, _ = store.enqueue("slack", "C0ALERTS", {"text": "refused"})
    assert {store.get(e.id).status for e in (acked, nacked, failed)} == {DeliveryStatus.PENDING}
    seen: list[DeliveryEntry] = []
    providers.webhook.on_request = lambda path, key: seen.append(store.get(nacked.id))

    before = utcnow()
    outcome = drain(svc)

    # while its request was at the receiver the entry was stored, claimed under a lease
    # and marked as having left
    assert seen and all(e.status is DeliveryStatus.IN_FLIGHT and e.attempts == 1
                        and e.lease_until is not None and e.request_left_at is not None
                        for e in seen)
    done = store.get(acked.id)
    assert done.status is DeliveryStatus.ACKED and done.platform_message_id == "1"
    assert done.duration_ms is not None and done.acked_at is not None
    retry = store.get(nacked.id)
    assert (retry.status, retry.attempts) == (DeliveryStatus.PENDING, 1)
    assert retry.next_attempt_at >= before + timedelta(seconds=5)
    refused = store.get(failed.id)
    assert (refused.status, refused.failure_reason) == (DeliveryStatus.FAILED, "permanent")
    assert "msg_too_long" in (refused.last_error or "")
    summary = {k: outcome.body[k] for k in ("recovered", "failed", "skippedMaxRetries",
                                            "deferredBackoff")}
    assert summary == {"recovered": 1, "failed": 1, "skippedMaxRetries": 0, "deferredBackoff": 0}
    # the summary is logged after the cycle, whole
    [record] = logged.messages(r"^queue_drained$")
    assert record.__dict__["summary"] == outcome.body


def test_a_permanent_refusal_is_moved_aside_at_once_with_its_reason_and_never_sent_again(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    # Telegram's own wordings; at 403 the text decides (a bare 403 is refused credentials)
    refusals = [telegram_error(400, "Bad Request: user not found"),
                telegram_error(403, "Forbidden: user is deactivated"),
                telegram_error(403, "FORBIDDEN: HAVE NO RIGHTS TO SEND A MESSAGE"),
                telegram_error(400, "Bad Request: " + "x" * 5000)]
    providers.telegram.script.extend(refusals)
    chat = [store.enqueue("telegram", "1001", {"text": f"to the chat {n}"})[0]
            for n in range(len(refusals))]
    providers.slack.answers.append((200, {"ok": False, "error": "user_not_found"}, {}))
    slack, _ = store.enqueue("slack", "C0ALERTS", {"text": "to a user gone"})
    providers.webhook.scripts["/hooks/refuses"] = [422]
    webhook, _ = store.enqueue("webhook", hook(providers, "refuses"), {"text": "invalid"})
    blocked, _ = store.enqueue("telegram", "1002", {"text": "to a chat that blocked the bot"})

    outcome = drain(svc)

    for entry, words in zip([*chat, slack, webhook], [
            "telegram 400: Bad Request: user not found",
            "telegram 403: Forbidden: user is deactivated",
            "telegram 403: FORBIDDEN: HAVE NO RIGHTS TO SEND A MESSAGE",
            "telegram 400: Bad Request: xxx", "slack: user_not_found",
            "webhook answered 422"], strict=True):
        stored = store.get(entry.id)
        assert (stored.status, stored.failure_reason, stored.attempts) == (
            DeliveryStatus.FAILED, "permanent", 1), stored
        assert (stored.last_error or "").startswith(f"PermanentDeliveryError: {words}")
    assert len(store.get(chat[3].id).last_error or "") == 2000, "cut at 2,000 characters"
    # one request each: a permanent refusal is never retried in process
    assert len(providers.telegram.http.requests) == len(refusals) + 1
    assert len(providers.slack.http.requests) == 1 and requests_to(providers, "refuses") == 1
    assert (outcome.body["failed"], outcome.outcome) == (6, "failures")
    # a refusal that says the chat is gone fails it too, counted apart: its chat is disabled
    gone = store.get(blocked.id)
    assert (gone.status, gone.failure_reason) == (DeliveryStatus.FAILED, "destination_disabled")
    assert outcome.body["failedDisabled"] == 1 and list(outcome.body["disabled"]) == [
        "telegram:1002"]

    due_now(svc)
    again = drain(svc)
    assert (again.body["failed"], again.body["recovered"]) == (0, 0)
    assert len(providers.telegram.http.requests) == len(refusals) + 1, "moved aside for good"
    assert {e.status for e in store.list()} == {DeliveryStatus.FAILED}


@pytest.mark.parametrize("status", [400, 403])
def test_the_refusals_the_document_names_fail_at_once_at_any_status(
        svc: Services, providers: Providers, status: int) -> None:
    store = DeliveryStore(svc.db)
    named = ("Conversation not found", "User deactivated", "Message too long", "Invalid format")
    entries = []
    for text in named:
        providers.telegram.script.append(telegram_error(status, f"Forbidden: {text}"))
        providers.slack.answers.append((status, {"ok": False, "error": text}, {}))
        entries += [store.enqueue("telegram", "1001", {"text": text})[0],
                    store.enqueue("slack", "C0ALERTS", {"text": text})[0]]

    outcome = drain(svc)

    assert outcome.body["failed"] == 8 and outcome.body["outages"]["destinations"] == []
    for entry in entries:
        stored = store.get(entry.id)
        assert (stored.status, stored.failure_reason, stored.attempts) == (
            DeliveryStatus.FAILED, "permanent", 1), stored
        assert entry.payload["text"] in (stored.last_error or "")
    # one request each: never retried in process, never held
    assert len(providers.telegram.http.requests) == len(providers.slack.http.requests) == 4


def test_an_entry_is_retried_from_its_stored_payload_with_every_option_it_carries(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    providers.telegram.script.extend([telegram_error(502, "Bad Gateway")] * 3)
    chat, _ = store.enqueue("telegram", "1001", {
        "payloads": ["**disk** <sda1> & more", "second part"], "threadId": "42",
        "replyToId": "7", "silent": True, "mirror": True, "gatewayClientScopes": ["ops"]})

    first = drain(svc)

    assert first.body["recovered"] == 0 and providers.telegram.messages == []
    assert store.get(chat.id).attempts == 1, "its own failure: retried on the schedule"
    media = [store.enqueue("telegram", "1001", payload)[0] for payload in (
        {"mediaUrl": "https://cdn.test/a.gif", "gifPlayback": True},
        {"mediaUrl": "https://cdn.test/b.pdf", "gifPlayback": True, "forceDocument": True},
        {"mediaUrl": "https://cdn.test/c.png", "silent": True})]
    store.enqueue("slack", "C0ALERTS", {"text": "in a thread", "threadId": "1699999999.000100",
                                        "silent": True})
    store.enqueue("slack", "C0ALERTS", {"text": "a reply", "replyToId": "1699999999.000200"})
    store.enqueue("email", "ops@example.com", {"subject": "Disk", "text": "full",
                                               "replyToId": "<first@sluice.test>",
                                               "threadId": "<root@sluice.test>"})
    due_now(svc)

    second = drain(svc)

    assert second.body["recovered"] == 7
    texts = [m for m in providers.telegram.messages if "text" in m]
    # the retry is sent from the stored entry alone: every option as first given
    assert [m["text"] for m in texts] == ["disk <sda1> & more", "second part"]
    assert texts[0]["raw"] == "<b>disk</b> &lt;sda1&gt; &amp; more"
    assert all(m["thread_id"] == 42 and m["silent"] for m in texts)
    assert [m["reply_to"] for m in texts] == [7, None]
    sent = {m["method"]: m for m in providers.telegram.messages if "method" in m}
    assert sent["sendAnimation"]["animation"] == "https://cdn.test/a.gif"
    assert sent["sendDocument"]["document"] == "https://cdn.test/b.pdf"
    assert sent["sendPhoto"]["photo"] == "https://cdn.test/c.png" and sent["sendPhoto"]["silent"]
    assert [m.get("thread_ts") for m in providers.slack.messages] == [
        "1699999999.000100", "1699999999.000200"]
    [mail] = providers.smtp.messages
    assert mail["In-Reply-To"] == "<first@sluice.test>"
    assert mail["References"] == "<root@sluice.test> <first@sluice.test>"
    # the producer's fields are kept with the entry and sent nowhere
    kept = store.get(chat.id)
    assert kept.payload["mirror"] is True and kept.payload["gatewayClientScopes"] == ["ops"]
    assert all(b"gatewayClientScopes" not in r["body"] and b"mirror" not in r["body"]
               for r in providers.telegram.http.requests)
    assert {store.get(e.id).status for e in media} == {DeliveryStatus.ACKED}


def _three_chunks() -> str:
    paragraph = "Disk <sda1> & <sdb1> at 97 % on **db-1**; see `df -h`. " * 20
    return "\n\n".join(f"{n}: {paragraph.strip()}" for n in range(6))  # three chunks


def test_a_long_message_goes_in_chunks_in_each_platforms_markup(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    text = _three_chunks() * 2
    chat, _ = store.enqueue("telegram", "1001", {"text": text})
    store.enqueue("slack", "C0ALERTS", {"text": text})
    store.enqueue("email", "ops@example.com", {"subject": "Disk", "text": "**db-1** a < b & c"})

    assert drain(svc).body["recovered"] == 3

    sent = providers.telegram.messages
    assert len(sent) >= 3 and all(len(m["text"]) <= TELEGRAM_MAX for m in sent)
    assert all(m["parse_mode"] == "HTML" for m in sent)
    assert "&lt;sda1&gt; &amp; &lt;sdb1&gt;" in sent[0]["raw"] and "<b>db-1</b>" in sent[0]["raw"]
    assert "\n\n".join(m["text"] for m in sent) == re.sub(r"\*\*|`", "", text), \
        "split on paragraphs: nothing lost or reordered"
    assert store.get(chat.id).platform_message_id == ",".join(
        str(m["message_id"]) for m in sent)
    slack = providers.slack.messages
    assert len(slack) >= 2 and all(len(m["text"]) <= 4000 for m in slack)
    assert "*db-1*" in slack[0]["text"] and "&lt;sda1&gt;" in slack[0]["text"]
    [mail] = providers.smtp.messages
    plain, html = (part.get_payload(decode=True).decode() for part in mail.get_payload())
    assert plain.strip() == "db-1 a < b & c" and "<b>db-1</b> a &lt; b &amp; c" in html


def test_best_effort_skips_a_chunk_refused_for_good_and_a_transient_chunk_fails_the_send(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    refusal = telegram_error(400, "Bad Request: can't parse entities: for this chunk")
    text = _three_chunks()
    providers.telegram.script.extend([None, refusal, None])
    best, _ = store.enqueue("telegram", "1001", {"text": text, "bestEffort": True})
    assert drain(svc).body["recovered"] == 1
    assert store.get(best.id).status is DeliveryStatus.ACKED
    assert len(providers.telegram.messages) == 2, "the chunk refused for good was skipped"

    providers.telegram.script.extend([None, refusal])
    strict, _ = store.enqueue("telegram", "1001", {"text": text})
    assert drain(svc).body["failed"] == 1
    assert store.get(strict.id).failure_reason == "permanent", "without bestEffort it fails"

    providers.telegram.script.extend([None, *[telegram_error(502, "Bad Gateway")] * 3])
    later, _ = store.enqueue("telegram", "1001", {"text": text, "bestEffort": True})
    before = len(providers.telegram.messages)
    result = drain(svc).body
    assert result["recovered"] == 0
    assert store.get(later.id).status is DeliveryStatus.PENDING, "a transient chunk fails the send"
    # the next send resumes after the chunk accepted: each chunk arrives once
    due_now(svc)
    assert drain(svc).body["recovered"] == 1
    resent = [m["text"] for m in providers.telegram.messages[before:]]
    assert len(resent) == 3 and len(set(resent)) == 3


@pytest.fixture
def receivers() -> Iterator[list[WebhookReceiver]]:
    """Four more webhook receivers, each its own host:port (its own receiver key)."""
    made = [WebhookReceiver(WEBHOOK_SECRET) for _ in range(4)]
    for receiver in made:
        receiver.__enter__()
    try:
        yield made
    finally:
        for receiver in made:
            receiver.__exit__(None, None, None)


def test_only_what_provably_did_not_arrive_is_retried_in_process_on_the_logged_waits(
        db_url: str, providers: Providers, receivers: list[WebhookReceiver],
        make_services: Callable[..., Services], logged: Logged) -> None:
    svc = make_services(db_url, **{**providers.env(),
                                   "SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS": "1"})
    store = DeliveryStore(svc.db)
    blip, down, refused, credentials = receivers
    blip.answers.extend([503, 502])
    down.answers.extend([503, 502, 500])
    refused.answers.append(422)
    credentials.answers.append(401)
    providers.webhook.slow = 1
    entries = {name: store.enqueue("webhook", url, {"text": name})[0] for name, url in (
        ("blip", blip.url), ("down", down.url), ("refused", refused.url),
        ("credentials", credentials.url), ("unknown", providers.webhook.url),
        ("unreachable", f"http://127.0.0.1:{free_port()}/hook"))}

    result = drain(svc).body
    providers.webhook.release.set()

    stored = {name: store.get(e.id) for name, e in entries.items()}
    # answers that say "not taken" are tried three times within the one attempt
    assert stored["blip"].status is DeliveryStatus.ACKED and stored["blip"].attempts == 1
    assert len(blip.received) == 3
    waits = [(r.__dict__["attempt"], r.__dict__["delayS"])
             for r in logged.messages(rf"webhook {entries['blip'].id}: attempt \d failed")]
    assert waits == [(1, 0.3), (2, 0.6)], "300 ms doubling, each retry logged with its label"
    # after the last try the last error is what the entry keeps
    assert len(down.received) == 3 and "webhook answered 500" in (stored["down"].last_error or "")
    assert stored["down"].status is DeliveryStatus.PENDING
    # a refusal for good, refused credentials and a send with no answer: tried once
    assert len(refused.received) == 1 and stored["refused"].status is DeliveryStatus.FAILED
    assert len(credentials.http.requests) == 1
    assert stored["credentials"].status is DeliveryStatus.PENDING
    assert len(providers.webhook.received) == 1
    assert stored["unknown"].unknown_sends == 1, "the request left: an unknown outcome"
    assert stored["unknown"].status is DeliveryStatus.PENDING, "a webhook may get it again"
    # a receiver never reached: transient, the entry waits
    assert stored["unreachable"].status is DeliveryStatus.PENDING
    assert "ConnectError" in (stored["unreachable"].last_error or "")
    assert result["failed"] == 1 and result["unknown"] == 1


def test_the_drain_stops_claiming_once_shutdown_has_begun_and_leaves_the_rest_due(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    entries = [store.enqueue("webhook", hook(providers, f"n{n}"), {"text": str(n)})[0]
               for n in range(6)]
    providers.webhook.on_request = lambda path, key: SHUTDOWN.set()
    try:
        result = drain(svc).body
    finally:
        SHUTDOWN.clear()
        providers.webhook.on_request = None

    # the send in flight ended; nothing more was claimed or sent
    assert len(providers.webhook.received) == 1 and result["recovered"] == 1
    assert result["leftDue"] == 5
    statuses = [store.get(e.id).status for e in entries]
    assert statuses.count(DeliveryStatus.PENDING) == 5
    assert {store.get(e.id).attempts for e in entries
            if store.get(e.id).status is DeliveryStatus.PENDING} == {0}
    assert drain(svc).body["recovered"] == 5, "the next run sends them"


def test_a_redrive_of_an_entry_its_destinations_410_failed_is_sent_by_the_next_run(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    providers.webhook.scripts["/hooks/gone"] = [410]
    gone, _ = store.enqueue("webhook", hook(providers, "gone"), {"text": "first"})
    assert list(drain(svc).body["disabled"]) == [f"webhook:{hook(providers, 'gone')}"]
    assert store.get(gone.id).failure_reason == "destination_disabled"

    redriven = store.redrive(gone.id)
    assert (redriven.status, redriven.attempts, redriven.last_error) == (
        DeliveryStatus.PENDING, 0, None)
    result = drain(svc).body

    assert result["recovered"] == 1 and store.get(gone.id).status is DeliveryStatus.ACKED
    assert requests_to(providers, "gone") == 2
    later, _ = store.enqueue("webhook", hook(providers, "gone"), {"text": "not redriven"})
    assert drain(svc).body["failedDisabled"] == 1, "the destination stays disabled"
    assert store.get(later.id).status is DeliveryStatus.FAILED
    assert requests_to(providers, "gone") == 2


def test_a_locked_sqlite_store_is_an_outage_the_next_run_recovers_from(
        sqlite_url: str, providers: Providers, make_services: Callable[..., Services],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    from sluice.store import db as store_db

    svc = make_services(sqlite_url, **providers.env())
    store = DeliveryStore(svc.db)
    entry, _ = store.enqueue("telegram", "1001", {"text": "held by a lock"})
    monkeypatch.setattr(store_db, "BUSY_TIMEOUT_S", 1.0)
    locker = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")  # another process holds the database's write lock
    try:
        outcome = run_job(get_job("delivery-drain"), svc, "schedule")
    finally:
        locker.execute("ROLLBACK")
        locker.close()

    # SQLITE_BUSY past the busy timeout is a transient store error: the run ends typed,
    # nothing is sent or counted, and the next run goes on
    assert (outcome.status, outcome.body["error"]["cause"]) == (500, "store_unavailable")
    assert "database is locked" in outcome.body["error"]["message"]
    assert providers.telegram.messages == []
    stored = store.get(entry.id)
    assert (stored.status, stored.attempts) == (DeliveryStatus.PENDING, 0)
    assert drain(svc).body["recovered"] == 1, "the next run, the lock gone, delivers it"
