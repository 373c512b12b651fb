"""The public formats and the decisions made from them, without any service."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from sluice.billing.ledger_redrive import MAX_ATTEMPTS, Settlement
from sluice.billing.polar import _event_errors, classify, polar_event, retry_after_seconds
from sluice.billing.usage import (
    RetryEnvelope,
    UsageEntry,
    dead_letter,
    iso,
    ledger_row_from_contract,
    metering_row,
)
from sluice.core.errors import ConfigurationError, RequestError
from sluice.core.settings import Settings
from sluice.egress import Answer

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ENTRY = UsageEntry(id="e1", model="m", occurred_at=T0, tenant_id="t", user_id="u",
                   input_tokens=3, output_tokens=4, cost_micros=50)


@pytest.mark.parametrize("status, verdict", [
    (200, "ok"), (202, "ok"), (408, "transient"), (425, "transient"), (429, "transient"),
    (500, "transient"), (503, "transient"), (400, "permanent"), (404, "permanent"),
    (422, "permanent"), (401, "unauthorized"), (403, "unauthorized"),
])
def test_polar_statuses_are_classified(status: int, verdict: str) -> None:
    assert classify(status) == verdict


def test_retry_after_accepts_seconds_and_dates() -> None:
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("12") == 12.0
    assert retry_after_seconds("Wed, 21 Oct 2026 07:28:00 GMT") == 0.0


def test_per_event_errors_are_read_from_the_validation_detail() -> None:
    body = {"detail": [
        {"loc": ["body", "events", 1, "metadata", "k"], "msg": "too long"},
        {"loc": ["body", "events", 1, "name"], "msg": "missing"},
        {"loc": ["body", "events", 9], "msg": "out of range"},
        {"loc": ["body"], "msg": "whole body"},
        "junk",
    ]}
    response = Answer(422, {}, json.dumps(body).encode(), "")
    assert _event_errors(response, 3) == {
        1: "polar 422: metadata.k: too long; polar 422: name: missing"}
    assert _event_errors(Answer(400, {}, b"<html>", ""), 3) == {}


def test_the_polar_event_shape() -> None:
    row = {"id": "e1:metering", "event_name": "ai_usage", "external_customer_id": "t",
           "metadata": {"a": 1}, "occurred_at": None, "created_at": T0}
    assert polar_event(row) == {"name": "ai_usage", "external_customer_id": "t",
                                "metadata": {"a": 1}, "external_id": "e1:metering",
                                "timestamp": "2026-03-01T12:00:00.000Z"}


def test_iso_is_utc_with_z() -> None:
    assert iso(datetime(2026, 1, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))) == \
        "2026-01-01T12:00:00.000Z"


@pytest.mark.parametrize("changes, message", [
    ({"id": ""}, "id must be a non-empty string"),
    ({"model": ""}, "model must be a non-empty string"),
    ({"user_id": 5}, "user_id must be a string or null"),
    ({"input_tokens": True}, "input_tokens must be a whole number"),
    ({"output_tokens": 1.5}, "output_tokens must be a whole number"),
    ({"cost_micros": -1}, "cost_micros must be a whole number"),
    ({"cost_micros": 2**63}, "cost_micros is larger than"),
    ({"occurred_at": datetime(2026, 1, 1)}, "timezone-aware"),
])
def test_entries_are_validated(changes: dict[str, object], message: str) -> None:
    fields = {"id": "e", "model": "m", "occurred_at": T0, **changes}
    with pytest.raises(RequestError, match=message):
        UsageEntry(**fields)  # type: ignore[arg-type]


def test_the_contract_entry_round_trips_and_accepts_offsets() -> None:
    data = ENTRY.to_contract()
    assert data == {"id": "e1", "tenantId": "t", "userId": "u", "model": "m", "inputTokens": 3,
                    "outputTokens": 4, "costMicros": 50, "occurredAt": "2026-03-01T12:00:00.000Z"}
    assert UsageEntry.from_contract(data) == ENTRY
    offset = {**data, "occurredAt": "2026-03-01T13:00:00+01:00"}
    assert UsageEntry.from_contract(offset).occurred_at == T0
    minimal = UsageEntry.from_contract({"model": "m", "occurredAt": "2026-03-01T12:00:00"},
                                       fallback_id="x")
    assert (minimal.id, minimal.input_tokens, minimal.occurred_at) == ("x", 0, T0)



@pytest.mark.parametrize("occurred, as_written", [
    ("2026-03-01T12:00:00.000Z", True), ("2026-03-01 12:00:00.123456+00:00", True),
    ("2026-03-01T12:00:00Z", True), ("2026-03-01T13:00:00+01:00", False),
    ("2026-03-01T12:00:00", False), ("20260301T120000Z", False), ("2026-W09-7T12:00Z", False),
    ("2026-03-01T12:00:00,5Z", False), ("2026-03-01T12:00:00.1234567Z", False),
])
def test_a_contract_row_is_the_ledger_row_of_the_parsed_entry(occurred: str,
                                                               as_written: bool) -> None:
    # GIVEN an entry as a producer wrote it, with its time in any form Python accepts
    data = {**ENTRY.to_contract(), "occurredAt": occurred}
    parsed = UsageEntry.from_contract(data)
    # WHEN ledger-redrive turns it into a row without building the entry
    row = ledger_row_from_contract(data)
    # THEN the row holds the same values and the same instant; a time is sent as written
    # only in the plain UTC forms Postgres reads as Python does
    expected = parsed.ledger_row()
    assert {**row, "occurred_at": None} == {**expected, "occurred_at": None}
    assert datetime.fromisoformat(row["occurred_at"]) == parsed.occurred_at
    assert row["occurred_at"] == (occurred if as_written else expected["occurred_at"])


@pytest.mark.parametrize("changes", [
    {"id": ""}, {"id": None}, {"model": ""}, {"model": 3}, {"tenantId": 5}, {"userId": ["u"]},
    {"inputTokens": True}, {"inputTokens": None}, {"outputTokens": 1.5}, {"costMicros": -1},
    {"costMicros": 2**63}, {"inputTokens": 2**31}, {"occurredAt": "yesterday"},
    {"occurredAt": 1700000000},
])
def test_a_contract_row_is_checked_as_the_entry_is(changes: dict[str, object]) -> None:
    data = {**ENTRY.to_contract(), **changes}
    with pytest.raises(RequestError) as parsed:
        UsageEntry.from_contract(data)
    with pytest.raises(RequestError) as row:
        ledger_row_from_contract(data)
    assert row.value.message == parsed.value.message
    with pytest.raises(RequestError, match="not an object"):
        ledger_row_from_contract(["not", "a", "dict"])


def test_a_minimal_contract_row_gets_the_entry_s_defaults() -> None:
    row = ledger_row_from_contract({"model": "m", "occurredAt": "2026-03-01T12:00:00Z"},
                                   fallback_id="x")
    assert row == {"id": "x", "tenant_id": None, "user_id": None, "model": "m",
                   "input_tokens": 0, "output_tokens": 0, "cost_micros": 0,
                   "occurred_at": "2026-03-01T12:00:00Z"}

@pytest.mark.parametrize("raw, reason", [
    ("nope", "not JSON"), ("3", "not a JSON object"), ('{"id": 1, "entry": {}}', "no string id"),
    ('{"id": "a"}', "no entry object"), ('{"id": "a", "entry": {}, "attempts": -1}', "attempts"),
    ('{"id": "a", "entry": {}, "attempts": "2"}', "attempts"),
])
def test_malformed_envelopes_say_why(raw: str, reason: str) -> None:
    with pytest.raises(RequestError, match=reason):
        RetryEnvelope.parse(raw)


def test_envelopes_round_trip() -> None:
    env = RetryEnvelope.for_entry(ENTRY, last_error="down", now=T0)
    assert json.loads(env.to_json()) == {"id": "e1", "attempts": 0,
                                         "enqueuedAt": "2026-03-01T12:00:00.000Z",
                                         "lastError": "down", "entry": ENTRY.to_contract()}
    assert RetryEnvelope.parse(env.to_json()) == env


def test_dead_letters_keep_the_item_and_say_why() -> None:
    assert json.loads(dead_letter('{"id": "a", "x": 1}', "max_attempts", T0)) == {
        "id": "a", "x": 1, "reason": "max_attempts", "deadLetteredAt": "2026-03-01T12:00:00.000Z"}
    assert json.loads(dead_letter("[1]", "malformed: not a JSON object", T0))["raw"] == "[1]"


def test_failed_entries_requeue_until_the_last_attempt() -> None:
    plan = Settlement()
    below = RetryEnvelope("a", MAX_ATTEMPTS - 2, "t", None, {})
    last = RetryEnvelope("b", MAX_ATTEMPTS - 1, "t", None, {})
    plan.failed("raw-a", below, "boom", T0)
    plan.failed("raw-b", last, "boom", T0)
    (op_a, raw_a, new_a), (op_b, _, new_b) = plan.steps
    assert (op_a, raw_a) == ("requeue", "raw-a")
    assert json.loads(new_a)["attempts"] == MAX_ATTEMPTS - 1
    assert json.loads(new_a)["lastError"] == "boom"
    assert op_b == "dlq"
    assert json.loads(new_b)["attempts"] == MAX_ATTEMPTS
    assert json.loads(new_b)["reason"] == "max_attempts"


def test_billing_follows_the_tenant_then_the_user() -> None:
    row = metering_row(ENTRY)
    assert row is not None and row["external_customer_id"] == "t"
    assert row["id"] == "e1:metering" and row["event_name"] == "ai_usage"
    assert all(isinstance(v, (int, str)) for v in row["metadata"].values())
    no_tenant = UsageEntry(id="e2", model="m", occurred_at=T0, user_id="u", cost_micros=1)
    assert metering_row(no_tenant)["external_customer_id"] == "u"  # type: ignore[index]
    assert metering_row(UsageEntry(id="e3", model="m", occurred_at=T0, user_id="u")) is None


@pytest.mark.parametrize("value, ok", [("1", True), ("100", True), ("0", False), ("101", False),
                                       ("x", False)])
def test_events_per_request_is_bounded(value: str, ok: bool) -> None:
    env = {"SLUICE_METERING_EVENTS_PER_REQUEST": value}
    if ok:
        assert Settings.from_env(env).metering_events_per_request == int(value)
    else:
        with pytest.raises(ConfigurationError, match="SLUICE_METERING_EVENTS_PER_REQUEST"):
            Settings.from_env(env)
