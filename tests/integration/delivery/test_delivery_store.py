"""The delivery queue store on both backends: write-ahead, leases, settle guards, schedule."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest

from sluice.core.errors import Conflict, ConstraintViolation, NotFound, RequestError
from sluice.delivery.policy import Policy
from sluice.delivery.store import DeliveryEntry, DeliveryStatus, DeliveryStore, _typed
from sluice.store.db import Database, PostgresDatabase, utcnow
from tests.integration.store.test_transaction_cost import round_trips

LEASE = timedelta(seconds=30)


@pytest.fixture
def store(db: Database) -> DeliveryStore:
    return DeliveryStore(db, policy=Policy(deduplicating=frozenset({"webhook"})))


def test_enqueue_is_write_ahead_and_idempotent_on_its_key(store: DeliveryStore) -> None:
    entry, created = store.enqueue("webhook", "https://h/x", {"text": "a", "n": [1, 2]},
                                   idempotency_key="alert:1", subject_user_id="u1")
    assert created and entry.status is DeliveryStatus.PENDING and entry.attempts == 0
    assert entry.payload == {"text": "a", "n": [1, 2]} and entry.subject_user_id == "u1"
    again, created_again = store.enqueue("webhook", "https://h/x", {"text": "b"},
                                         idempotency_key="alert:1")
    assert not created_again and again.id == entry.id and again.payload["text"] == "a"
    other, _ = store.enqueue("webhook", "https://h/x", {"text": "a"})
    assert other.id != entry.id and other.dedupe_key == other.id
    with pytest.raises(RequestError):
        store.enqueue("", "x", {})


def test_enqueue_returns_the_stored_row_without_reading_it_back(store: DeliveryStore) -> None:
    now = utcnow()
    for lease in (None, LEASE):
        entry, created = store.enqueue("webhook", "https://h/x", {"text": "a", "n": [1, 2]},
                                       idempotency_key=f"k:{lease}", subject_user_id="u1",
                                       lease=lease, now=now)
        assert created and entry == store.get(entry.id)


def test_an_entry_id_collision_is_an_error_never_another_entry(
        store: DeliveryStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the idempotency key may conflict quietly; a clash on the id must not hand back
    # someone else's entry as if it were this one.
    first, _ = store.enqueue("webhook", "https://h/x", {"text": "first"})
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(first.id))
    with pytest.raises(ConstraintViolation):
        store.enqueue("webhook", "https://h/y", {"text": "second"})
    assert store.get(first.id).payload == {"text": "first"}


def test_enqueue_is_one_round_trip_on_postgres(pg_url: str) -> None:
    db = PostgresDatabase(pg_url, max_size=1)
    try:
        store = DeliveryStore(db)
        store.enqueue("webhook", "https://h/x", {"text": "warm"})
        flights, trace = round_trips(db, lambda: store.enqueue(
            "webhook", "https://h/x", {"text": "a"}, idempotency_key="k", lease=LEASE))
        assert flights == 1, trace
        flights, trace = round_trips(db, lambda: store.enqueue(
            "webhook", "https://h/x", {"text": "b"}, idempotency_key="k"))
        assert flights == 2, trace  # the key is taken: one more to read that entry
    finally:
        db.close()


def test_claim_takes_due_pending_entries_oldest_first_under_a_lease(
        store: DeliveryStore) -> None:
    now = utcnow()
    first, _ = store.enqueue("slack", "C1", {"text": "1"}, now=now - timedelta(seconds=2))
    second, _ = store.enqueue("slack", "C1", {"text": "2"}, now=now - timedelta(seconds=1))
    [claimed] = store.claim(LEASE, now=now)
    assert claimed.id == first.id and claimed.status is DeliveryStatus.IN_FLIGHT
    assert claimed.attempts == 1 and claimed.lease_until == now + LEASE
    assert [e.id for e in store.claim(LEASE, limit=10, now=now)] == [second.id]
    assert store.claim(LEASE, limit=10, now=now) == []


def test_claim_is_two_statements_in_one_transaction_and_two_round_trips_on_postgres(
        pg_url: str) -> None:
    db = PostgresDatabase(pg_url, max_size=1)
    try:
        store = DeliveryStore(db)
        stored = [store.enqueue("slack", "C1", {"text": str(n)})[0] for n in range(3)]
        claimed: list[DeliveryEntry] = []
        flights, trace = round_trips(db, lambda: claimed.extend(store.claim(LEASE, limit=3)))
        # the claim (nothing read back: RETURNING gives the claimed rows), then the marking
        # of the claimed probes' receivers with the commit
        assert flights == 2, trace
        assert trace.count('Parse\t "" "BEGIN"') == trace.count('Parse\t "" "COMMIT"') == 1, \
            "one transaction"
        assert [e.id for e in claimed] == [e.id for e in stored]
        assert all(e.status is DeliveryStatus.IN_FLIGHT and e.attempts == 1 for e in claimed)
    finally:
        db.close()


def test_a_returning_row_given_as_text_reads_as_a_selected_one() -> None:
    # An SQLite that does not type RETURNING columns returns what it stored, as text.
    now = utcnow()
    row = {"payload": '{"text":"x"}', "next_attempt_at": str(now), "lease_until": None,
           "enqueued_at": now, "updated_at": str(now), "acked_at": None, "failed_at": None}
    typed = _typed(row)
    assert typed["payload"] == {"text": "x"} and typed["next_attempt_at"] == now
    assert typed["updated_at"] == now and typed["enqueued_at"] is now


def test_ack_settles_once_and_only_the_attempt_that_holds_the_entry(
        store: DeliveryStore) -> None:
    store.enqueue("telegram", "1001", {"text": "hi"})
    [entry] = store.claim(LEASE)
    assert store.ack(entry, "42", 15)
    assert not store.ack(entry, "43", 16), "a second ack changes nothing"
    acked = store.get(entry.id)
    assert (acked.status, acked.platform_message_id, acked.duration_ms) == (
        DeliveryStatus.ACKED, "42", 15)
    assert acked.acked_at is not None and acked.lease_until is None


def test_nack_follows_the_schedule_then_fails_on_the_fifth_attempt(
        store: DeliveryStore) -> None:
    entry, _ = store.enqueue("slack", "C1", {"text": "x"})
    now = utcnow()
    waits = []
    for attempt in range(1, 6):
        [claimed] = store.claim(LEASE, now=now)
        assert claimed.attempts == attempt
        status = store.nack(claimed, f"boom {attempt}", now=now)
        current = store.get(entry.id)
        if attempt < 5:
            assert status is DeliveryStatus.PENDING
            waits.append((current.next_attempt_at - now).total_seconds())
            assert store.claim(LEASE, now=now) == [], "not due before its backoff"
            now = current.next_attempt_at
        else:
            assert status is DeliveryStatus.FAILED
            assert current.status is DeliveryStatus.FAILED and current.failed_at is not None
            assert current.last_error == "gave up after 5 attempts; last error: boom 5"
    assert waits == [5, 25, 120, 600]


def test_fail_is_final(store: DeliveryStore) -> None:
    store.enqueue("telegram", "9", {"text": "x"})
    [entry] = store.claim(LEASE)
    assert store.fail(entry, "Bad Request: chat not found")
    assert not store.nack(entry, "late"), "a settled entry cannot be nacked"
    failed = store.get(entry.id)
    assert failed.status is DeliveryStatus.FAILED and failed.last_error.endswith("chat not found")
    assert store.claim(LEASE, now=utcnow() + timedelta(days=1)) == []


def test_a_lapsed_lease_returns_to_pending_and_the_stale_sender_cannot_settle(
        store: DeliveryStore) -> None:
    now = utcnow()
    entry, _ = store.enqueue("webhook", "https://h", {"a": 1}, lease=LEASE, now=now)
    assert entry.status is DeliveryStatus.IN_FLIGHT and entry.attempts == 1
    assert store.request_left(entry, now=now)
    assert store.recover(now=now + LEASE - timedelta(seconds=1)) == (0, 0, 0)
    assert store.recover(now=now + LEASE + timedelta(seconds=1)) == (1, 0, 0)
    back = store.get(entry.id)
    assert back.status is DeliveryStatus.PENDING and "lease expired" in (back.last_error or "")
    [again] = store.claim(LEASE, now=now + LEASE + timedelta(seconds=1))
    assert again.attempts == 2
    assert not store.ack(entry, "late", 1), "the first sender's ack is stale"
    assert store.ack(again, "m", 1)


def test_a_poison_entry_that_kills_every_sender_rests_unknown_never_loops(
        store: DeliveryStore) -> None:
    entry, _ = store.enqueue("webhook", "https://h", {"a": 1})
    now = utcnow()
    for attempt in range(1, 6):
        [claimed] = store.claim(LEASE, now=now)  # ... and the sender dies holding it
        assert claimed.attempts == attempt
        assert store.request_left(claimed, now=now), "after its request left"
        now += LEASE + timedelta(seconds=1)
        assert store.recover(now=now) == (
            (1, 0, 0) if attempt < 5 else (0, 1, 0))
    dead = store.get(entry.id)
    assert dead.status is DeliveryStatus.UNKNOWN and "attempt 5" in (dead.last_error or "")
    assert dead.unknown_sends == 5
    assert store.claim(LEASE, now=now + timedelta(days=1)) == []


def test_a_sender_dying_twice_on_a_chat_entry_rests_unknown_after_one_resend(
        store: DeliveryStore) -> None:
    entry, _ = store.enqueue("telegram", "1001", {"text": "x"})
    now = utcnow()
    for expected in ((1, 0, 0), (0, 1, 0)):
        [claimed] = store.claim(LEASE, now=now)
        assert store.request_left(claimed, now=now)
        now += LEASE + timedelta(seconds=1)
        assert store.recover(now=now) == expected
    assert store.get(entry.id).status is DeliveryStatus.UNKNOWN


def test_a_lease_that_lapses_before_its_request_left_gives_the_attempt_back(
        store: DeliveryStore) -> None:
    # GIVEN senders that claim the entry and die before any request leaves (the limiter
    # or the store failing, the process stopped), again and again
    entry, _ = store.enqueue("telegram", "1001", {"text": "x"})
    now = utcnow()
    for n in range(1, 6):
        [claimed] = store.claim(LEASE, now=now)
        assert claimed.attempts == 1
        now += LEASE + timedelta(seconds=1)
        # THEN each lapse is the attempt given back, never an unknown outcome, and the
        # fifth in a row ends it failed unsent (it cannot stall the queue)
        assert store.recover(now=now) == ((1, 0, 0) if n < 5 else (0, 0, 1))
    back = store.get(entry.id)
    assert (back.status, back.attempts, back.unknown_sends) == (DeliveryStatus.FAILED, 0, 0)
    assert back.failure_reason == "lease_lost" and "not sent (5 in a row)" in back.last_error


def test_a_sender_dying_holding_a_claim_counts_the_lapse_against_its_first_entry_only(
        store: DeliveryStore) -> None:
    # GIVEN a claim of three entries (three chats), and senders that die holding it before
    # any request leaves, five times in a row (an entry that kills its sender, sent first)
    now = utcnow()
    entries = [store.enqueue("telegram", chat, {"text": chat},
                             now=now - timedelta(minutes=3 - n))[0]
               for n, chat in enumerate(("1001", "1002", "1003"))]
    for n in range(1, 6):
        claimed = store.claim(LEASE, limit=3, now=now)
        assert [e.id for e in claimed] == [e.id for e in entries]
        now += LEASE + timedelta(seconds=1)
        # THEN every attempt is given back, and only the first, whose turn it was, counts
        # the lapse: it fails unsent at the fifth, the two it never reached wait for the next
        assert store.recover(now=now) == ((3, 0, 0) if n < 5 else (2, 0, 1))
    first, *rest = (store.get(e.id) for e in entries)
    assert (first.status, first.failure_reason) == (DeliveryStatus.FAILED, "lease_lost")
    assert [(e.status, e.attempts, e.unsent_lapses) for e in rest] == [
        (DeliveryStatus.PENDING, 0, 0)] * 2
    # AND a sender dying after the first of the rest was sent counts no lapse against the
    # one after it (the request that left is an unknown outcome, the other never reached)
    sent, after = store.claim(LEASE, limit=3, now=now)
    assert store.request_left(sent, now=now)
    assert store.recover(now=now + LEASE + timedelta(seconds=1)) == (2, 0, 0)
    assert [store.get(e.id).unsent_lapses for e in (sent, after)] == [0, 0]


def test_lapsed_claims_are_recovered_whole_and_each_counts_its_own_first_entry(
        store: DeliveryStore) -> None:
    # GIVEN two claims of two entries each (two workers, or two runs), both lapsed
    now = utcnow()
    entries = [store.enqueue("telegram", chat, {"text": chat},
                             now=now - timedelta(minutes=4 - n))[0]
               for n, chat in enumerate(("1001", "1002", "1003", "1004"))]
    first = store.claim(LEASE, limit=2, now=now)
    second = store.claim(LEASE, limit=2, now=now + timedelta(seconds=1))
    assert [e.id for e in first + second] == [e.id for e in entries]
    # WHEN recovery reads a page smaller than the first claim
    later = now + LEASE + timedelta(seconds=2)
    assert store.recover(now=later, limit=1) == (2, 0, 0), "the first claim, whole"
    assert store.recover(now=later, limit=1) == (2, 0, 0), "then the second"
    # THEN each claim's first entry counts one lapse, and only it
    assert [store.get(e.id).unsent_lapses for e in entries] == [1, 0, 1, 0]


def test_prune_deletes_old_settled_entries_only(store: DeliveryStore) -> None:
    old = utcnow() - timedelta(days=10)
    store.enqueue("slack", "C1", {"text": "old"}, now=old)
    [entry] = store.claim(LEASE, now=old)
    store.ack(entry, "1", 1, now=old)
    store.enqueue("slack", "C1", {"text": "old pending"}, now=old)
    store.enqueue("slack", "C1", {"text": "recent"}, lease=LEASE)
    assert store.prune(utcnow() - timedelta(days=7)) == 1
    assert sorted(e.payload["text"] for e in store.list()) == ["old pending", "recent"]


def test_admin_list_show_redrive_and_purge(store: DeliveryStore) -> None:
    for chat in ("1", "2", "3"):
        store.enqueue("telegram", chat, {"text": chat})
    store.enqueue("slack", "C1", {"text": "s"})
    for entry in store.claim(LEASE, limit=10):
        if entry.channel == "telegram":
            store.fail(entry, "Forbidden: bot was blocked by the user")
    failed = store.list(status=DeliveryStatus.FAILED)
    assert len(failed) == 3 and {e.channel for e in failed} == {"telegram"}
    assert store.stats()["failed"]["count"] == 3 and store.stats()["in_flight"]["count"] == 1

    redriven = store.redrive(failed[0].id)
    assert (redriven.status, redriven.attempts, redriven.last_error) == (
        DeliveryStatus.PENDING, 0, None)
    with pytest.raises(Conflict):
        store.redrive(failed[0].id)
    store.purge(failed[1].id)
    with pytest.raises(NotFound):
        store.get(failed[1].id)
    with pytest.raises(Conflict):
        store.purge(redriven.id)
    with pytest.raises(NotFound):
        store.purge("missing")
    assert store.redrive_all(channel="slack") == 0
    assert store.purge_all(channel="telegram") == 1
    assert store.stats()["failed"]["count"] == 0
    with pytest.raises(RequestError):
        store.list(limit=0)


def test_concurrent_claimers_never_take_the_same_entry(store: DeliveryStore) -> None:
    for i in range(40):
        store.enqueue("slack", "C1", {"text": str(i)})
    taken: list[str] = []
    lock = threading.Lock()

    def claimer() -> None:
        while claimed := store.claim(LEASE, limit=3):
            with lock:
                taken.extend(e.id for e in claimed)

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(taken) == 40 and len(set(taken)) == 40
