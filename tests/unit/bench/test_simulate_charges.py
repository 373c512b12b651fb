"""A crash forgives the entry it hit, and only while it explains it (``charges.py``): an
invariant that forgave every entry an attempt per crash anywhere would forgive exactly the
attempts a wrong policy row adds."""

from __future__ import annotations

from datetime import UTC, datetime

from bench.simulate.charges import Charges
from bench.simulate.operator import match_of
from sluice.delivery.policy import DeliveryStatus
from sluice.delivery.store import DeliveryEntry

T0 = datetime(2026, 1, 5, tzinfo=UTC)


def _entry(entry_id: str, story: int, status: DeliveryStatus, attempts: int) -> DeliveryEntry:
    return DeliveryEntry(entry_id, "telegram", "1001", None,
                         {"payloads": [f"story-{story}: an alert"]}, None, status, attempts,
                         T0, None, None, None, None, T0, T0, None, None)


def test_a_crash_after_a_claim_forgives_that_entry_while_its_run_still_holds_it() -> None:
    charges = Charges(match_of)
    claimed = _entry("a", 1, DeliveryStatus.IN_FLIGHT, 2)
    other = _entry("b", 2, DeliveryStatus.IN_FLIGHT, 2)
    charges.claimed = [claimed]
    charges.hit("delivery.after_claim", None)
    assert charges.forgiven(claimed) == 1
    assert charges.forgiven(other) == 0  # a crash of another entry explains nothing here
    assert charges.hits[match_of(claimed)] == 1 and not charges.hits[match_of(other)]
    # its lease lapsed and the attempt was given back: nothing left to forgive
    assert charges.forgiven(claimed._replace(status=DeliveryStatus.PENDING, attempts=1)) == 0
    assert charges.forgiven(claimed) == 0  # and not again, claimed anew later


def test_a_crash_after_a_send_names_the_match_whose_request_just_left() -> None:
    charges = Charges(match_of)
    charges.claimed = [_entry("a", 1, DeliveryStatus.IN_FLIGHT, 1)]
    charges.hit("delivery.after_send", ("telegram", "1001", 7))
    charges.hit("consumer.after_handler", ("telegram", "1001", 8))  # not a delivery point
    assert dict(charges.hits) == {("telegram", "1001", 7): 1}
    assert charges.forgiven(charges.claimed[0]) == 0  # its request left: it counts


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
