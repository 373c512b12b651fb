"""Batches on both stores: many entries enqueued in one commit (checked as one call checks
one, nothing stored when one is refused), a round of claimed entries marked leaving in one
statement (which reads the destinations' pause and disable) and settled in one commit,
and a drain whose commits are shared by the batch, not paid per entry."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from typing import Any

import pytest

import sluice
from sluice.core.errors import RequestError
from sluice.core.services import Services
from sluice.delivery.keys import keys_for
from sluice.delivery.policy import DeliveryOutcome, Policy
from sluice.delivery.store import DeliveryStatus, DeliveryStore, NewEntry, Settle
from sluice.store.db import Database, utcnow
from tests.integration.delivery.helpers import Providers, drain_once

LEASE = timedelta(seconds=60)


def _count(store: DeliveryStore) -> int:
    return sum(store.queue_status()["depth"].values())


@contextmanager
def counting(db: Database) -> Iterator[list[int]]:
    """The transactions ``db`` begins inside the block, counted."""
    begun = [0]
    original = db.transaction

    def transaction() -> AbstractContextManager[Any]:
        begun[0] += 1
        return original()

    db.transaction = transaction  # type: ignore[method-assign]
    try:
        yield begun
    finally:
        db.transaction = original  # type: ignore[method-assign]


# --- enqueue_many / sluice.enqueue_deliveries -------------------------------------------


def test_many_entries_are_stored_in_one_commit_in_order_with_their_keys(
        services: Services) -> None:
    store = DeliveryStore(services.db)
    items = [NewEntry("webhook", f"https://h{i % 2}.example/hook", {"text": f"m{i}"},
                      idempotency_key=f"k{i}") for i in range(5)]
    with counting(services.db) as begun:
        stored = store.enqueue_many(items)
    assert begun == [1], "one transaction for the whole batch"
    assert [created for _, created in stored] == [True] * 5
    for (entry, _), item in zip(stored, items, strict=True):
        keys = keys_for(item.channel, item.recipient)
        got = store.get(entry.id)
        assert got == entry, "what is answered is what is stored"
        assert (got.status, got.attempts) == (DeliveryStatus.PENDING, 0)
        assert (got.destination, got.receiver) == (keys.destination, keys.receiver)
    claimed = store.claim(LEASE, limit=10)
    assert [e.payload["text"] for e in claimed] == [f"m{i}" for i in range(5)], "in order"


def test_a_key_stored_already_or_given_twice_answers_that_entry(services: Services) -> None:
    store = DeliveryStore(services.db)
    first, _ = store.enqueue("slack", "C01", {"text": "one"}, idempotency_key="dup")
    stored = store.enqueue_many([NewEntry("slack", "C01", {"text": "again"}, "dup"),
                                 NewEntry("slack", "C01", {"text": "new"}, "fresh"),
                                 NewEntry("slack", "C01", {"text": "twice"}, "fresh")])
    assert [(e.id == first.id, created) for e, created in stored[:1]] == [(True, False)]
    assert stored[1][1] and not stored[2][1] and stored[2][0].id == stored[1][0].id
    assert _count(store) == 2


def test_one_bad_item_refuses_the_batch_and_stores_nothing(services: Services) -> None:
    store = DeliveryStore(services.db)
    with pytest.raises(RequestError) as refused:
        store.enqueue_many([NewEntry("slack", "C01", {"text": "fine"}),
                            NewEntry("slack", "", {"text": "no recipient"})])
    assert refused.value.context["field"] == "items[1]"
    assert _count(store) == 0


@pytest.mark.parametrize(("item", "field"), [
    ({"channel": "pigeon", "recipient": "C01", "payload": {"text": "x"}}, "items[2].channel"),
    ({"channel": "telegram", "recipient": "not a chat", "payload": {"text": "x"}},
     "items[2].recipient"),
    ({"channel": "slack", "recipient": "C01", "payload": {"text": ""}}, "items[2].payloads"),
    ({"channel": "slack", "recipient": "C01", "payload": {"text": "x"},
      "idempotency_key": "k" * 300}, "items[2].idempotencyKey"),
    ({"channel": "slack", "recipient": "C01"}, "items[2].payload"),
    ({"channel": "slack", "recipient": "C01", "payload": {"text": "x"}, "priority": 1},
     "items[2].priority"),
])
def test_the_public_batch_checks_each_item_as_enqueue_delivery_does(
        services: Services, item: dict[str, Any], field: str) -> None:
    good = {"channel": "slack", "recipient": "C01", "payload": {"text": "fine"}}
    with pytest.raises(RequestError) as refused:
        sluice.enqueue_deliveries(services, [good, good, item])
    assert refused.value.context["field"] == field
    if not field.endswith("priority"):  # the one call refuses the same value
        one = {k: v for k, v in item.items()}
        with pytest.raises(RequestError) as alone:
            sluice.enqueue_delivery(services, one.pop("channel"), one.pop("recipient"),
                                    one.pop("payload", None), **one)  # type: ignore[arg-type]
        assert f"items[2].{alone.value.context['field']}" == field
    assert _count(DeliveryStore(services.db)) == 0, "nothing stored"


def test_the_public_batch_stores_every_item(services: Services) -> None:
    entries = sluice.enqueue_deliveries(services, [
        {"channel": "slack", "recipient": f"C0{i}", "payload": {"text": f"m{i}"},
         "idempotency_key": f"batch:{i}", "subject_user_id": "u1"} for i in range(3)])
    assert [e.recipient for e in entries] == ["C00", "C01", "C02"]
    assert all(e.subject_user_id == "u1" and e.status is DeliveryStatus.PENDING for e in entries)
    with pytest.raises(RequestError):
        sluice.enqueue_deliveries(services, {"channel": "slack"})  # type: ignore[arg-type]


# --- the round's mark and settle --------------------------------------------------------


def test_one_statement_marks_a_round_leaving_but_not_what_an_operator_paused(
        services: Services) -> None:
    store = DeliveryStore(services.db)
    store.enqueue_many([NewEntry("slack", f"C0{i}", {"text": f"m{i}"}) for i in range(4)])
    claimed = store.claim(LEASE, limit=4)
    assert len(claimed) == 4
    from sluice.delivery.destinations import Destinations

    Destinations(services.db, 3, Policy()).pause("slack:C01", utcnow() + timedelta(hours=1))
    stale = claimed[2]._replace(attempts=claimed[2].attempts + 1)  # not this attempt's
    marked = store.requests_left([claimed[0], claimed[1], stale, claimed[3]])
    assert marked == {claimed[0].id, claimed[3].id}
    for entry in claimed:
        left = store.get(entry.id).request_left_at
        assert (left is not None) == (entry.id in marked)


def test_a_round_settles_in_one_commit_each_entry_guarded(services: Services) -> None:
    store = DeliveryStore(services.db)
    store.enqueue_many([NewEntry("slack", f"C0{i}", {"text": f"m{i}"}) for i in range(4)])
    a, b, c, d = store.claim(LEASE, limit=4)
    policy = store.policy
    settles = [Settle(a, policy.decide(DeliveryOutcome.ACKED), message_id="m-a", duration_ms=5),
               Settle(b, policy.decide(DeliveryOutcome.TRANSIENT, attempts=1), "timeout"),
               Settle(c._replace(attempts=9), policy.decide(DeliveryOutcome.ACKED)),
               Settle(d, policy.decide(DeliveryOutcome.ACKED), message_id="m-d")]
    with counting(services.db) as begun:
        assert store.settle(settles) == [True, True, False, True]
    assert begun == [1]
    got = {e.id: store.get(e.id) for e in (a, b, c, d)}
    assert (got[a.id].status, got[a.id].platform_message_id, got[a.id].duration_ms) == (
        DeliveryStatus.ACKED, "m-a", 5)
    assert (got[b.id].status, got[b.id].last_error) == (DeliveryStatus.PENDING, "timeout")
    assert got[c.id].status is DeliveryStatus.IN_FLIGHT, "a stale settle changes nothing"
    assert got[d.id].status is DeliveryStatus.ACKED
    assert store.settle(settles[:1]) == [False], "settled once: never acknowledged twice"


def test_a_drain_marks_and_settles_a_round_once(
        db_url: str, providers: Providers, make_services: Callable[..., Services],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """32 entries to 32 Slack channels (32 rate keys: one round): one claim, one mark and
    one settle for the 32, where one entry at a time paid a mark and a settle each."""
    svc = make_services(db_url, **providers.env(), SLUICE_SLACK_CHANNEL_RATE_PER_SECOND="1000")
    providers.slack.channels.update(f"C{i:02d}" for i in range(32))
    store = DeliveryStore(svc.db)
    store.enqueue_many([NewEntry("slack", f"C{i:02d}", {"text": f"m{i}"}) for i in range(32)])
    calls: Counter[str] = Counter()
    for name in ("claim", "requests_left", "settle"):
        original = getattr(DeliveryStore, name)

        def counted(self: DeliveryStore, *args: Any, _name: str = name,
                    _original: Any = original, **kwargs: Any) -> Any:
            found = _original(self, *args, **kwargs)
            if found:
                calls[_name] += 1
            return found

        monkeypatch.setattr(DeliveryStore, name, counted)
    result = drain_once(svc)
    assert result["recovered"] == 32
    assert sorted(m["channel"] for m in providers.slack.messages) == [
        f"C{i:02d}" for i in range(32)], "each sent once"
    assert calls == {"claim": 1, "requests_left": 1, "settle": 1}
