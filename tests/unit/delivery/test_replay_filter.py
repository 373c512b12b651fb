"""The replay's filter, as the API and the command line both read it: strict instants, a
bounded window that is not in the future, known statuses and channels, and no field it
would not honour. Every refusal is a ``RequestError`` (400, exit 64) naming its field."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from sluice.core.errors import RequestError
from sluice.delivery.policy import OPERATOR_FROM, DeliveryOutcome
from sluice.delivery.replay import MAX_WINDOW, REPLAYS, STATUSES, ReplayReport, parse_filter

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CHANNELS = ("webhook", "slack", "telegram", "email")
GOOD = {"destination": "webhook:hooks.example.com:443", "since": "2026-12-01T10:00:00Z"}


def parse(**values: Any) -> Any:
    return parse_filter({**GOOD, **values}, channels=CHANNELS, now=NOW)


def test_the_defaults_are_failed_entries_up_to_now() -> None:
    flt = parse()
    assert (flt.status, flt.channel, flt.until) == ("failed", None, NOW)
    assert flt.since == datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    assert flt.to_json() == {"destination": "webhook:hooks.example.com:443", "channel": None,
                             "since": "2026-12-01T10:00:00.000Z",
                             "until": "2026-12-01T12:00:00.000Z", "status": "failed",
                             "after": None}
    other = parse(until="2026-12-01T12:00:00+01:00", status="acked", channel="webhook")
    assert (other.until, other.status, other.channel) == (
        datetime(2026, 12, 1, 11, 0, tzinfo=UTC), "acked", "webhook")


@pytest.mark.parametrize(("values", "field", "words"), [
    ({"since": "2026-12-01T10:00:00"}, "since", "with its offset"),
    ({"since": "2026-12-01"}, "since", "with its offset"),
    ({"since": None}, "since", "non-empty string"),
    ({"until": "2026-12-01T11:00"}, "until", "with its offset"),
    ({"until": "2026-12-01T09:00Z"}, "until", "later than since"),
    ({"until": "2026-12-01T10:00Z"}, "until", "later than since"),
    ({"until": "2026-12-01T12:00:01Z"}, "until", "in the future"),
    ({"since": "2026-10-01T10:00Z"}, "since", "at most 31 days"),
    ({"status": "pending"}, "status", "must be one of"),
    ({"status": "in_flight"}, "status", "must be one of"),
    ({"status": ["failed"]}, "status", "must be one of"),
    ({"channel": ["webhook"]}, "channel", "must be one of"),
    ({"channel": "carrier-pigeon"}, "channel", "must be one of"),
    ({"destination": None}, "destination", "non-empty string"),
    ({"destination": "webhook:a b"}, "destination", "spaces"),
    ({"destination": "x" * 600}, "destination", "at most"),
    ({"after": "an id"}, "after", "spaces"),
    ({"after": ["e1"]}, "after", "non-empty string"),
    ({"limit": 100}, "limit", "unknown field"),
    ({"cap": 1}, "cap", "unknown field"),
])
def test_a_value_it_cannot_honour_is_refused_naming_the_field(
        values: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(RequestError) as info:
        parse(**values)
    assert info.value.context["field"] == field
    assert words in info.value.message


def test_a_window_of_exactly_the_bound_is_taken() -> None:
    since = NOW - MAX_WINDOW
    assert parse(since=since.isoformat()).since == since


def test_each_status_restarts_as_an_operator_row_of_the_policy() -> None:
    assert STATUSES == ("failed", "expired", "acked", "unknown")
    assert {status: OPERATOR_FROM[outcome] for status, (outcome, _) in REPLAYS.items()} == {
        "failed": ("failed",), "expired": ("failed",), "acked": ("acked",),
        "unknown": ("unknown",)}
    assert REPLAYS["acked"][0] is DeliveryOutcome.REPLAY_ACKED


def test_a_continuation_is_the_filter_again_resuming_after_its_entry_to_the_microsecond() -> None:
    flt = parse(until="2026-12-01T11:59:59.123456Z")
    last = datetime(2026, 12, 1, 10, 30, 0, 654321, tzinfo=UTC)
    report = ReplayReport(flt, dry_run=False, next=flt._replace(since=last, after="e-41"))
    body = report.to_json()["next"]
    assert body == {"destination": flt.destination, "channel": None, "status": "failed",
                    "since": "2026-12-01T10:30:00.654321Z",
                    "until": "2026-12-01T11:59:59.123456Z", "after": "e-41"}
    assert parse_filter(body, channels=CHANNELS, now=NOW) == report.next
    assert ReplayReport(flt, dry_run=False).to_json()["next"] is None
