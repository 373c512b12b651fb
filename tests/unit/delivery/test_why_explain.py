"""``explain`` on values, for what the drain walk does not stage: several holds at once (the
one ending last is the answer, named by rank when two end together), a disable before a
pause, a lapsed lease settled by the policy's lapse rows, a channel configured since."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sluice.delivery.policy import Policy
from sluice.delivery.store import DeliveryEntry, DeliveryStatus
from sluice.delivery.why import Hold, explain

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
EXPIRE = timedelta(days=1)
RECEIVER = "webhook:hooks.example:443"
URL = "webhook:https://hooks.example/a"


def entry(**fields: Any) -> DeliveryEntry:
    base = DeliveryEntry(
        "e1", "webhook", "https://hooks.example/a", None, {"text": "x"}, None,
        DeliveryStatus.PENDING, 1, NOW, None, None, None, None, NOW - timedelta(minutes=5),
        NOW, None, None, destination=URL, receiver=RECEIVER)
    return base._replace(**fields)


def state(key: str = RECEIVER, **columns: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"key": key, "down_since": None, "failures": 0, "last_error": None,
                           "next_probe_at": None, "paused_until": None, "disabled_at": None,
                           "disabled_reason": None, "ready_at": None}
    return {**row, **columns}


def ask(e: DeliveryEntry, *states: dict[str, Any], **kwargs: Any) -> Any:
    return explain(e, list(states), NOW, policy=Policy(), expire=EXPIRE,
                   configured=kwargs.pop("configured", ("webhook",)), **kwargs)


def test_the_hold_ending_last_is_the_answer() -> None:
    failing = state(down_since=NOW - timedelta(hours=1), failures=3, last_error="refused",
                    next_probe_at=NOW + timedelta(minutes=10))
    paused = state(URL, paused_until=NOW + timedelta(minutes=5))
    answer = ask(entry(), paused, failing)
    assert (answer.kind, answer.until, answer.key) == (
        Hold.PROBE, NOW + timedelta(minutes=10), RECEIVER)
    longer = state(URL, paused_until=NOW + timedelta(hours=1))
    answer = ask(entry(), longer, failing)
    assert (answer.kind, answer.until, answer.key) == (Hold.PAUSED, NOW + timedelta(hours=1), URL)
    assert "nothing expires while paused" in answer.sentence


def test_a_providers_wait_is_named_over_the_entrys_own_due_time_it_set() -> None:
    until = NOW + timedelta(seconds=40)
    answer = ask(entry(next_attempt_at=until), state(ready_at=until))
    assert (answer.kind, answer.until) == (Hold.PROVIDER, until)
    kept = ask(entry(next_attempt_at=NOW - timedelta(minutes=5)), state(ready_at=until))
    assert (kept.kind, kept.until) == (Hold.SLOT, until), "a slot: the entry kept its place"


def test_a_disable_comes_before_a_pause_unless_restarted_after_it() -> None:
    off = state(disabled_at=NOW - timedelta(hours=1), disabled_reason="gone",
                paused_until=NOW + timedelta(hours=1))
    assert ask(entry(), off).kind is Hold.DISABLED
    again = entry(restarted_at=NOW - timedelta(minutes=1))
    assert ask(again, off).kind is Hold.PAUSED, "redriven after the disable: it goes once"


def test_the_expiry_fails_it_first_but_never_while_paused() -> None:
    old = entry(enqueued_at=NOW - timedelta(days=2))
    assert ask(old).kind is Hold.EXPIRED
    assert ask(old, state(paused_until=NOW + timedelta(minutes=1))).kind is Hold.PAUSED
    assert ask(old._replace(started_at=NOW - timedelta(hours=1))).kind is Hold.DUE


def test_a_probe_due_goes_first_and_the_others_wait_behind_it() -> None:
    failing = state(down_since=NOW - timedelta(hours=1), failures=2, last_error="refused",
                    next_probe_at=NOW - timedelta(seconds=1))
    probe = ask(entry(), failing, first_in_line="e1")
    assert probe.kind is Hold.DUE and "probe" in probe.sentence
    behind = ask(entry(), failing, first_in_line="e0")
    assert behind.kind is Hold.PROBE and "e0" in behind.sentence


def test_a_channel_configured_since_releases_what_waited_for_it() -> None:
    held = entry(held_by="unconfigured:webhook", next_attempt_at=NOW + timedelta(hours=1))
    assert ask(held, configured=()).kind is Hold.UNCONFIGURED
    assert ask(held).kind is Hold.DUE, "the next drain releases it, due at once"
    assert ask(held, configured=None).kind is Hold.UNCONFIGURED, "as the last drain found it"


@pytest.mark.parametrize(("left", "unknown_sends", "unsent_lapses", "then"), [
    (True, 0, 0, "due at once"),
    (True, 1, 0, "rests unknown"),
    (False, 0, 0, "due at once"),
    (False, 0, 4, "fails lease_lost"),
])
def test_a_lapsed_lease_is_settled_by_the_lapse_rows(left: bool, unknown_sends: int,
                                                     unsent_lapses: int, then: str) -> None:
    lapsed = entry(status=DeliveryStatus.IN_FLIGHT, lease_until=NOW - timedelta(seconds=1),
                   request_left_at=NOW - timedelta(minutes=2) if left else None,
                   unknown_sends=unknown_sends, unsent_lapses=unsent_lapses, channel="telegram")
    answer = ask(lapsed)
    assert answer.kind is Hold.IN_FLIGHT and then in answer.sentence, answer.sentence
    held = ask(lapsed._replace(lease_until=NOW + timedelta(minutes=1)))
    assert (held.kind, held.until) == (Hold.IN_FLIGHT, NOW + timedelta(minutes=1))
