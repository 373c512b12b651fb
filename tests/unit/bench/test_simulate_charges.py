"""A stopped drain run forgives the entries its claim still holds, and only while it
explains them (``charges.py``): an invariant that forgave every entry an attempt per crash
anywhere would forgive exactly the attempts a wrong policy row adds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bench.simulate.charges import Charges
from bench.simulate.operator import match_of
from sluice.delivery.policy import DeliveryStatus
from sluice.delivery.store import DeliveryEntry

T0 = datetime(2026, 1, 5, tzinfo=UTC)
LEASE_END = T0 + timedelta(minutes=2)


def _entry(entry_id: str, story: int, status: DeliveryStatus = DeliveryStatus.IN_FLIGHT,
           attempts: int = 1) -> DeliveryEntry:
    lease = LEASE_END if status is DeliveryStatus.IN_FLIGHT else None
    return DeliveryEntry(entry_id, "telegram", "1001", None,
                         {"payloads": [f"story-{story}: an alert"]}, None, status, attempts,
                         lease or T0, lease, None, None, None, T0, T0, None, None)


def test_a_run_stopped_after_its_claim_forgives_each_entry_it_still_holds_while_it_does(
        ) -> None:
    # GIVEN a claim of three, the first settled before the crash right after the second's turn
    charges = Charges(match_of)
    charges.begin()
    first, second, third = (_entry(n, story) for n, story in (("a", 1), ("b", 2), ("c", 3)))
    charges.claimed = [first, second, third]
    now = {"a": first._replace(status=DeliveryStatus.ACKED), "b": second, "c": third}
    charges.hit("delivery.after_claim", None)
    charges.stopped(now.get)
    # THEN the two it still holds are forgiven one attempt each, the settled one nothing,
    # and an entry of no claim of that run nothing
    assert [charges.forgiven(e) for e in (now["a"], second, third)] == [0, 1, 1]
    assert charges.forgiven(_entry("d", 4)) == 0
    assert dict(charges.held) == {match_of(second): 1, match_of(third): 1}
    assert dict(charges.hits) == {match_of(first): 1}, "the crash names the claim's first"
    # AND once its lease lapsed (the attempt given back), nothing is left to forgive, not
    # even when it is claimed anew with the same count
    assert charges.forgiven(second._replace(status=DeliveryStatus.PENDING, attempts=0)) == 0
    assert charges.forgiven(second) == 0
    assert charges.forgiven(third._replace(lease_until=LEASE_END + timedelta(minutes=5))) == 0


def test_a_run_that_was_not_stopped_forgives_nothing_and_a_new_run_holds_nothing() -> None:
    charges = Charges(match_of)
    held = _entry("a", 1)
    charges.claimed = [held]
    charges.begin()  # the next run begins: the last run's claim is not its own
    charges.stopped({"a": held}.get)
    assert charges.forgiven(held) == 0 and not charges.held


def test_a_crash_after_a_send_names_the_match_whose_request_just_left() -> None:
    charges = Charges(match_of)
    sent = _entry("a", 1)._replace(request_left_at=T0)
    charges.claimed = [sent]
    charges.hit("delivery.after_send", ("telegram", "1001", 7))
    charges.hit("consumer.after_handler", ("telegram", "1001", 8))  # not a delivery point
    charges.stopped({"a": sent}.get)
    assert dict(charges.hits) == {("telegram", "1001", 7): 1}
    assert charges.forgiven(sent) == 0  # its request left: it counts


def test_a_crash_inside_a_round_forgives_every_entry_it_left_marked_and_unsettled() -> None:
    charges = Charges(match_of)
    sent, marked, settled = (_entry("a", 1, DeliveryStatus.IN_FLIGHT, 1),
                             _entry("b", 2, DeliveryStatus.IN_FLIGHT, 1),
                             _entry("c", 3, DeliveryStatus.IN_FLIGHT, 1))
    charges.marked = {e.id: e for e in (sent, marked)}  # c was settled before the crash
    charges.hit("delivery.after_send", match_of(sent))
    assert charges.hits[match_of(sent)] == 1 and charges.hits[match_of(marked)] == 1
    assert not charges.hits[match_of(settled)]
    assert charges.in_round == [match_of(marked)]
    # b's attempt was counted with no request seen: forgiven after its lapse too
    assert charges.forgiven(marked._replace(status=DeliveryStatus.PENDING)) == 1
    assert charges.forgiven(settled) == 0
    assert charges.marked == {}, "a crash ends the round"
