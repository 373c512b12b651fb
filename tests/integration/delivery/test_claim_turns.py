"""The claim's turns across receivers, on both stores: how many of one receiver a claim
takes (its share: ``per_round``, more when fewer receivers wait than the claim takes, one
of a failing or recently paced receiver), the rotation after ``after``, and that a
receiver with nothing claimable takes no place among those waiting."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from sluice.delivery.destinations import Destinations
from sluice.delivery.policy import Policy
from sluice.delivery.store import DeliveryStore
from sluice.store.db import Database, utcnow

LEASE = timedelta(seconds=30)


@pytest.fixture
def store(db: Database) -> DeliveryStore:
    return DeliveryStore(db, policy=Policy())


def _backlog(store: DeliveryStore, host: str, n: int) -> str:
    """``n`` due entries to ``host``; its receiver key."""
    start = utcnow() - timedelta(minutes=5)
    entries = [store.enqueue("webhook", f"https://{host}/x", {"n": k},
                             now=start + timedelta(milliseconds=k))[0] for k in range(n)]
    assert entries[0].receiver is not None
    return entries[0].receiver


def _per_receiver(store: DeliveryStore, **kwargs: object) -> Counter[str]:
    claimed = store.claim(LEASE, **kwargs)  # type: ignore[arg-type]
    return Counter(e.receiver or "" for e in claimed)


def test_a_lone_backlog_is_claimed_a_whole_claim_at_a_time_oldest_first(
        store: DeliveryStore) -> None:
    receiver = _backlog(store, "lone.example", 40)
    first = store.claim(LEASE, limit=32, per_round=4)
    assert [e.payload["n"] for e in first] == list(range(32))
    assert _per_receiver(store, limit=32, per_round=4) == {receiver: 8}


def test_the_share_grows_to_split_the_claim_among_the_receivers_waiting(
        store: DeliveryStore) -> None:
    a, b, c = (_backlog(store, f"{name}.example", 20) for name in "abc")
    # three wait: ceil(32 / 3) = 11 of each, the claim's 32 in turns (11, 11, 10)
    assert sorted(_per_receiver(store, limit=32, per_round=4).values()) == [10, 11, 11]
    many = [_backlog(store, f"m{k:02}.example", 6) for k in range(10)]
    # thirteen wait (more than 32 / 4): per_round at most, in turns, so two turns of all
    # thirteen and a third for the first six after ``after`` (then round to the start)
    taken = _per_receiver(store, limit=32, per_round=4, after=many[4])
    assert taken == {**{key: 3 for key in [*many[5:], a]},
                     **{key: 2 for key in [b, c, *many[:5]]}}


def test_a_failing_receiver_gives_its_probe_alone_and_a_paced_one_one_entry(
        store: DeliveryStore, db: Database) -> None:
    failing = _backlog(store, "down.example", 10)
    paced = _backlog(store, "paced.example", 10)
    healthy = _backlog(store, "up.example", 10)
    destinations = Destinations(db, threshold=1)
    now = utcnow()
    destinations.failed(failing, "refused", known=None, now=now - timedelta(days=1))
    destinations.paced(paced, now - timedelta(seconds=1), now=now - timedelta(seconds=2))
    # three wait, the claim takes 32: the healthy one takes the rest of it, the failing
    # receiver its one probe, the paced one a single entry
    assert _per_receiver(store, limit=32, per_round=4) == {failing: 1, paced: 1,
                                                           healthy: 10}
    # its probe is in flight: the failing receiver gives nothing more until it settles
    assert _per_receiver(store, limit=32, per_round=4) == {paced: 1}


def test_the_rotation_wraps_past_the_last_receiver(store: DeliveryStore) -> None:
    receivers = sorted(_backlog(store, f"r{k}.example", 2) for k in range(6))
    taken = store.claim(LEASE, limit=4, per_round=1, after=receivers[3])
    assert [e.receiver for e in taken] != [] and {e.receiver for e in taken} == {
        receivers[4], receivers[5], receivers[0], receivers[1]}


def test_a_receiver_with_nothing_claimable_takes_no_place_among_those_waiting(
        store: DeliveryStore, db: Database) -> None:
    paused = sorted(_backlog(store, f"p{k}.example", 3) for k in range(5))
    last = _backlog(store, "z.example", 3)
    destinations = Destinations(db, threshold=1)
    for key in paused:
        destinations.pause(key, utcnow() + timedelta(hours=1))
    # five paused receivers come first in the walk: the claim still reaches the last one,
    # and that one, alone waiting, takes the whole of its backlog
    assert _per_receiver(store, limit=2, per_round=1) == {last: 2}
