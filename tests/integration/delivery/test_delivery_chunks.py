"""Resumable chunks: a message in several chunks resumes after those the platform accepted,
each chunk takes its own rate slot, and a chunk whose answer never came follows the
unknown rule. Judged from what the Telegram stand-in accepted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta

from sluice.core.services import Services
from sluice.delivery.channels import Outbound
from sluice.delivery.chunks import ChunkLog
from sluice.delivery.drain import Deliverer
from sluice.delivery.ratelimit import US
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.jobs.registry import Deadline
from sluice.store.db import utcnow
from tests.integration.delivery.conftest import WIDE_RATES
from tests.integration.delivery.helpers import Providers, drain_once, due_now
from tests.integration.delivery.test_ratelimit import most_in_any_window
from tests.providers.telegram import Late

PARTS = ["part one", "part two", "part three"]
GROUP = "-100200"


def _accepted(providers: Providers) -> Counter[str]:
    return Counter(m["text"] for m in providers.telegram.messages)


def _bad_gateway() -> tuple[int, dict[str, object]]:
    return 502, {"ok": False, "error_code": 502, "description": "Bad Gateway"}


def _waits_over(svc: Services) -> None:
    due_now(svc)
    with svc.db.transaction() as tx:  # the chat's flood wait has passed for the rates too
        tx.execute("DELETE FROM delivery_rate_limits")


def test_a_failed_chunk_resumes_after_those_accepted_each_arriving_once(
        svc: Services, providers: Providers) -> None:
    # GIVEN a message in 3 chunks; Telegram takes chunk 1, fails chunk 2 transiently
    # (three 502s: the in-process retries; an answer about this entry alone, so its own
    # attempt), then answers it 429 with a 40 s wait (its attempt given back)
    providers.telegram.script.extend(
        [None, _bad_gateway(), _bad_gateway(), _bad_gateway(),
         (429, {"ok": False, "error_code": 429, "description": "Too Many Requests: retry "
                "after 40", "parameters": {"retry_after": 40}})])
    store = DeliveryStore(svc.db)
    entry, _ = store.enqueue("telegram", "1001", {"payloads": PARTS})

    # WHEN drains run until it is delivered
    first = drain_once(svc)
    assert first["outages"]["count"] == 0 and first["failed"] == 0
    waiting = store.get(entry.id)
    assert waiting.status is DeliveryStatus.PENDING and waiting.attempts == 1
    assert ChunkLog(svc.db).accepted(entry.id) == {1: "1"}, "chunk 1 recorded with its id"
    _waits_over(svc)
    second = drain_once(svc)
    assert second["rateLimited"] == 1
    assert store.get(entry.id).attempts == 1, "a flood wait costs no attempt"
    _waits_over(svc)
    third = drain_once(svc)

    # THEN each chunk arrived exactly once, in order, and the entry holds every id
    assert third["recovered"] == 1
    assert [m["text"] for m in providers.telegram.messages] == PARTS
    delivered = store.get(entry.id)
    assert delivered.status is DeliveryStatus.ACKED and delivered.attempts == 2
    assert delivered.platform_message_id == "1,2,3"
    assert len(providers.telegram.http.requests) == 7, "1 + 3 + 1 + 2: chunk 1 never again"
    # AND its chunk records go when the entry is pruned
    assert store.prune(utcnow() + timedelta(days=1)) == 1
    with svc.db.transaction() as tx:
        assert tx.fetchone("SELECT count(*) AS n FROM delivery_chunks") == {"n": 0}


def test_an_unknown_chunk_is_resent_only_as_the_unknown_rule_allows(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    # GIVEN chunk 2 taken by Telegram but answered after the send timeout (unknown), with
    # one resend allowed after an unknown outcome (the default)
    svc = make_services(db_url, **{**providers.env(), **WIDE_RATES,
                                   "SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS": "0.5"})
    providers.telegram.script.extend([None, Late(1.5)])
    store = DeliveryStore(svc.db)
    entry, _ = store.enqueue("telegram", "1001", {"payloads": PARTS})

    first = drain_once(svc)

    assert first["unknown"] == 1
    assert store.get(entry.id).status is DeliveryStatus.PENDING
    due_now(svc)
    assert drain_once(svc)["recovered"] == 1
    # THEN chunk 1 never went again; chunk 2 once more (the one resend the rule allows)
    assert _accepted(providers) == {"part one": 1, "part two": 2, "part three": 1}
    assert store.get(entry.id).status is DeliveryStatus.ACKED


def test_an_unknown_chunk_with_no_resend_left_rests_unknown_and_nothing_follows(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    svc = make_services(db_url, **{**providers.env(), **WIDE_RATES,
                                   "SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS": "0.5",
                                   "SLUICE_DELIVERY_UNKNOWN_RESENDS": "0"})
    providers.telegram.script.extend([None, Late(1.5)])
    store = DeliveryStore(svc.db)
    entry, _ = store.enqueue("telegram", "1001", {"payloads": PARTS})

    drain_once(svc)
    due_now(svc)
    drain_once(svc)

    assert store.get(entry.id).status is DeliveryStatus.UNKNOWN
    assert _accepted(providers) == {"part one": 1, "part two": 1}, "chunk 3 waits for an operator"


def test_each_chunk_takes_its_own_slot_of_the_chats_rate(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    # GIVEN Telegram's default rate of one message a second to a chat
    svc = make_services(db_url, **providers.env())
    DeliveryStore(svc.db).enqueue("telegram", "1001", {"payloads": PARTS})

    assert drain_once(svc)["recovered"] == 1

    # THEN no second of the chat's holds more than its one message (plus the one on the
    # window's edge, as for any rate): three chunks back to back would be three
    arrived = [int(m["received_at"] * US) for m in providers.telegram.messages]
    assert len(arrived) == 3
    assert most_in_any_window(arrived, US) <= 2
    assert max(arrived) - min(arrived) >= US, "three slots of a 1/s rate span 2 s, less jitter"


def test_no_slot_in_time_for_a_chunk_sets_the_entry_aside_and_it_resumes_there(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    # GIVEN a group chat (20 messages a minute: a slot every ~3.2 s) and a run whose time
    # left after chunk 1 is shorter than that
    svc = make_services(db_url, **{**providers.env(), "SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS": "1"})
    providers.telegram.chats.add(GROUP)
    store = DeliveryStore(svc.db)
    entry, _ = store.enqueue("telegram", GROUP, {"payloads": PARTS})

    with Outbound.open(svc.settings, deadline_s=4) as client:
        summary = Deliverer.from_services(svc, client).drain(Deadline(4))

    # THEN chunk 1 went, chunk 2 did not, and the entry waits for the slot, attempt given back
    assert summary["rateLimited"] == 1 and summary["recovered"] == 0
    aside = store.get(entry.id)
    assert aside.status is DeliveryStatus.PENDING and aside.attempts == 0
    assert "next chunk" in (aside.last_error or "")
    assert _accepted(providers) == {"part one": 1}
    # AND the next run, once the slot is there, resumes at chunk 2
    _waits_over(svc)
    with Outbound.open(svc.settings, deadline_s=30) as client:
        again = Deliverer.from_services(svc, client).drain(Deadline(30))
    assert again["recovered"] == 1
    assert [m["text"] for m in providers.telegram.messages] == PARTS


def _refuse_chunk_records(svc: Services) -> None:
    """The store refuses to record a chunk (a real trigger, in each dialect)."""
    with svc.db.transaction() as tx:
        if svc.db.dialect == "sqlite":
            tx.execute("CREATE TRIGGER no_chunks BEFORE INSERT ON delivery_chunks "
                       "BEGIN SELECT RAISE(ABORT, 'disk full'); END")
        else:
            tx.execute("CREATE FUNCTION no_chunks() RETURNS trigger LANGUAGE plpgsql AS "
                       "$$ BEGIN RAISE EXCEPTION 'disk full'; END $$")
            tx.execute("CREATE TRIGGER no_chunks BEFORE INSERT ON delivery_chunks "
                       "FOR EACH ROW EXECUTE FUNCTION no_chunks()")


def test_a_chunk_accepted_but_not_recorded_is_unknown_never_resent_blindly(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    # GIVEN no resend after an unknown outcome, and a store that cannot record chunk 1
    svc = make_services(db_url, **{**providers.env(), **WIDE_RATES,
                                   "SLUICE_DELIVERY_UNKNOWN_RESENDS": "0"})
    _refuse_chunk_records(svc)
    store = DeliveryStore(svc.db)
    entry, _ = store.enqueue("telegram", "1001", {"payloads": PARTS})

    first = drain_once(svc)
    due_now(svc)
    drain_once(svc)

    # THEN the entry rests unknown for an operator: chunk 1 went once, nothing after it
    assert first["unknown"] == 1
    rests = store.get(entry.id)
    assert rests.status is DeliveryStatus.UNKNOWN and rests.attempts == 1
    assert "could not be recorded" in (rests.last_error or "")
    assert _accepted(providers) == {"part one": 1}
