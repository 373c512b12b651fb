"""One timestamp form for every JSON payload: UTC, milliseconds, ``Z``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from sluice.core.times import from_epoch_ms, iso_z, iso_z_or_none, json_default, jsonable


def test_iso_z_is_utc_with_milliseconds_and_z() -> None:
    moment = datetime(2026, 1, 1, 14, 0, 5, 123987, tzinfo=timezone(timedelta(hours=2)))
    assert iso_z(moment) == "2026-01-01T12:00:05.123Z"
    assert iso_z(datetime(2026, 1, 1, tzinfo=UTC)) == "2026-01-01T00:00:00.000Z"
    assert iso_z_or_none(None) is None


def test_a_naive_datetime_is_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        iso_z(datetime(2026, 1, 1))


def test_epoch_milliseconds_and_nested_values() -> None:
    assert from_epoch_ms(1_767_225_600_123) == "2026-01-01T00:00:00.123Z"
    at = datetime(2026, 1, 1, tzinfo=UTC)
    assert jsonable({"a": [at, {"b": (at,)}], "c": 1}) == {
        "a": ["2026-01-01T00:00:00.000Z", {"b": ["2026-01-01T00:00:00.000Z"]}], "c": 1}
    assert json.dumps({"at": at}, default=json_default) == '{"at": "2026-01-01T00:00:00.000Z"}'
