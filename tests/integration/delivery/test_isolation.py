"""One member never decides for its group: an entry, a URL, a chat, an operator's action.

Each scenario runs the drain against real local receivers in a production shape: many URLs
on one host, a backlog of hundreds to one rate-limited Telegram group beside quiet chats,
an operator acting from inside a receiver's request handler, in the middle of a run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from sluice.core.services import Services
from sluice.delivery.channels import Outbound
from sluice.delivery.drain import Deliverer
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.jobs.registry import Deadline
from sluice.ops.destinations import apply, parse_change
from sluice.store.db import utcnow
from tests.integration.delivery.helpers import Providers, drain_once, due_now
from tests.providers.telegram import TelegramStandIn


def _url(providers: Providers, name: str) -> str:
    return f"{providers.webhook.http.url}/hooks/{name}"


def _requests(providers: Providers, name: str) -> int:
    return sum(1 for r in providers.webhook.received if r["path"] == f"/hooks/{name}")


def test_a_poison_entry_fails_alone_on_its_fifth_attempt_and_the_others_go_at_once(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    bad, _ = store.enqueue("webhook", _url(providers, "poison"), {"text": "bad"})
    providers.webhook.scripts["/hooks/poison"] = [500] * 100
    good = [store.enqueue("webhook", _url(providers, f"ok{n}"), {"text": f"good {n}"})[0]
            for n in range(3)]

    first = drain_once(svc)

    assert first["recovered"] == 3, "the good entries go in the first run"
    assert {store.get(e.id).status for e in good} == {DeliveryStatus.ACKED}
    held = store.get(bad.id)
    assert held.status is DeliveryStatus.PENDING and held.attempts == 1, "its own, counted"
    results = []
    for _ in range(4):
        due_now(svc)
        results.append(drain_once(svc))
    failed = store.get(bad.id)
    assert failed.status is DeliveryStatus.FAILED and failed.failure_reason == "max_attempts"
    assert failed.attempts == 5
    assert [r["skippedMaxRetries"] for r in results] == [0, 0, 0, 1]
    assert results[-1]["outages"]["destinations"] == [], "the receiver was never held"


def test_a_second_entry_failing_holds_the_receiver_and_counts_no_attempt(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    entries = [store.enqueue("webhook", _url(providers, f"down{n}"), {"text": str(n)})[0]
               for n in range(5)]
    providers.webhook.answers.extend([503] * 100)

    result = drain_once(svc)

    attempts = [store.get(e.id).attempts for e in entries]
    assert attempts == [0] * 5, "a second entry failing: the receiver's, given back to both"
    [down] = result["outages"]["destinations"]
    assert down["key"] == f"webhook:127.0.0.1:{providers.webhook.http.url.rsplit(':', 1)[1]}"
    assert down["waiting"] == 5
    # 3 requests (in-process retries) for each of the two entries tried; the rest unsent
    assert len(providers.webhook.received) == 6


def test_a_410_from_one_url_disables_that_url_and_not_its_host(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    providers.webhook.scripts["/hooks/tenant-a"] = [410]
    gone, _ = store.enqueue("webhook", _url(providers, "tenant-a"), {"text": "a1"})
    later, _ = store.enqueue("webhook", _url(providers, "tenant-a"), {"text": "a2"})
    others = [store.enqueue("webhook", _url(providers, f"tenant-{t}"), {"text": t})[0]
              for t in "bcd"]

    result = drain_once(svc)

    assert list(result["disabled"]) == [f"webhook:{_url(providers, 'tenant-a')}"]
    assert {store.get(e.id).status for e in others} == {DeliveryStatus.ACKED}
    assert store.get(gone.id).failure_reason == "destination_disabled"
    assert store.get(later.id).failure_reason == "destination_disabled"
    assert _requests(providers, "tenant-a") == 1
    fresh, _ = store.enqueue("webhook", _url(providers, "tenant-b"), {"text": "b2"})
    drain_once(svc)
    assert store.get(fresh.id).status is DeliveryStatus.ACKED, "the host keeps delivering"

    # an operator's redrive of the entry the 410 failed is sent by the next run
    store.redrive(gone.id)
    drain_once(svc)
    assert store.get(gone.id).status is DeliveryStatus.ACKED
    assert store.get(later.id).status is DeliveryStatus.FAILED, "not redriven: stays failed"


@pytest.fixture
def chats() -> Iterator[TelegramStandIn]:
    quiet = tuple(str(2001 + n) for n in range(20))
    with TelegramStandIn(chats=("-100500", *quiet)) as stand_in:
        yield stand_in


def test_a_group_backlog_drains_at_its_rate_while_every_quiet_chat_goes_first(
        db_url: str, providers: Providers, chats: TelegramStandIn,
        make_services: Callable[..., Services]) -> None:
    svc = make_services(db_url, **{**providers.env(), "SLUICE_TELEGRAM_API_URL": chats.url,
                                   "SLUICE_TELEGRAM_BOT_TOKEN": chats.token,
                                   "SLUICE_TELEGRAM_GROUP_RATE_PER_MINUTE": "60"})
    store = DeliveryStore(svc.db)
    for n in range(500):
        store.enqueue("telegram", "-100500", {"text": f"storm {n}"})
    for n in range(20):
        store.enqueue("telegram", str(2001 + n), {"text": "quiet"})
    started = time.monotonic()

    with Outbound.open(svc.settings, deadline_s=20) as client:
        deadline = Deadline(11.0)  # 6 s to send in: the last send's timeout (5 s) must fit
        Deliverer.from_services(svc, client, deadline=deadline).drain(deadline)

    left = [(e.recipient, e.last_error) for e in store.list(status=DeliveryStatus.PENDING,
                                                            limit=500) if e.recipient != "-100500"]
    quiet = [m for m in chats.messages if m["chat_id"] != "-100500"]
    assert not left, left
    group = [m for m in chats.messages if m["chat_id"] == "-100500"]
    assert len(quiet) == 20, "every quiet chat got its message"
    assert max(m["received_at"] for m in quiet) - started < 3.0, "in the first turns"
    # one a second (less the headroom) for the run's ~6 s: it waited for its slots
    assert 5 <= len(group) <= 8
    pending = store.list(status=DeliveryStatus.PENDING, limit=500)
    assert {e.attempts for e in pending} == {0}, "a missing slot costs no attempt"


def test_nothing_leaves_for_a_destination_once_its_pause_is_answered(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    key = f"webhook:{_url(providers, 'paused')}"
    for n in range(30):
        store.enqueue("webhook", _url(providers, "paused"), {"text": f"p{n}"})
    answers: list[dict[str, object]] = []

    def operator(path: str, _key: str) -> None:
        if path == "/hooks/paused" and _requests(providers, "paused") == 2:  # the third
            until = (utcnow() + timedelta(hours=1)).isoformat()
            answers.append(apply(svc, parse_change("pause", key, {"until": until})))

    providers.webhook.on_request = operator
    drain_once(svc)
    providers.webhook.on_request = None

    [answer] = answers
    assert _requests(providers, "paused") == 3, "only the request that had left"
    assert answer["moved"] == 28, "every entry not acked, claimed or not"
    pending = store.list(status=DeliveryStatus.PENDING)
    assert len(pending) == 27 and {e.attempts for e in pending} == {0}
    due_now(svc)
    assert drain_once(svc)["recovered"] == 0, "still paused"

    apply(svc, parse_change("resume", key, {}))
    assert drain_once(svc)["recovered"] == 27, "a resumed backlog is sent"


def test_a_resume_and_an_enable_with_redrive_mid_run_are_not_undone_by_the_run(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    paused = f"webhook:{_url(providers, 'p')}"
    disabled = f"webhook:{_url(providers, 'd')}"
    for n in range(5):
        store.enqueue("webhook", _url(providers, "p"), {"text": f"p{n}"})
        store.enqueue("webhook", _url(providers, "d"), {"text": f"d{n}"})
    until = (utcnow() + timedelta(hours=1)).isoformat()
    apply(svc, parse_change("pause", paused, {"until": until}))
    assert apply(svc, parse_change("disable", disabled, {}))["moved"] == 5
    for n in range(8):
        store.enqueue("webhook", _url(providers, f"busy{n}"), {"text": "busy"})
    acted: list[str] = []

    def operator(path: str, _key: str) -> None:
        if path.startswith("/hooks/busy") and not acted:
            acted.append(path)
            apply(svc, parse_change("resume", paused, {}))
            apply(svc, parse_change("enable", disabled, {}))
            store.redrive_all(destination=disabled)

    providers.webhook.on_request = operator
    first = drain_once(svc)
    providers.webhook.on_request = None
    second = drain_once(svc)

    assert acted
    assert first["recovered"] + second["recovered"] == 18
    assert _requests(providers, "p") == 5 and _requests(providers, "d") == 5
    assert first["failedDisabled"] == second["failedDisabled"] == 0
    assert all(e.status is DeliveryStatus.ACKED for e in store.list(limit=500))


def test_a_preview_counts_entries_no_drain_has_taken(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    for n in range(40):
        store.enqueue("webhook", _url(providers, f"new{n % 4}"), {"text": str(n)})
    host = f"webhook:127.0.0.1:{providers.webhook.http.url.rsplit(':', 1)[1]}"
    until = (utcnow() + timedelta(hours=1)).isoformat()

    answer = apply(svc, parse_change("pause", host, {"until": until}))

    assert answer["entries"]["pending"] == 40 and answer["moved"] == 40
    assert drain_once(svc)["recovered"] == 0
    assert not providers.webhook.received
