"""The one timestamp form of every JSON payload: UTC, millisecond precision, ``Z``.

``2026-01-31T12:00:00.123Z`` is what JavaScript's ``Date.prototype.toISOString()``
writes, so producers in either language agree byte for byte. Every API body,
CLI ``--json`` output, job result, message field and contract envelope formats
its datetimes here.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any


def iso_z(moment: datetime) -> str:
    """``moment`` as ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (a naive datetime is refused)."""
    if moment.tzinfo is None:
        raise ValueError("a naive datetime has no defined instant; pass an aware one")
    at = moment.astimezone(UTC)
    return f"{at:%Y-%m-%dT%H:%M:%S}.{at.microsecond // 1000:03d}Z"


def iso_z_or_none(moment: datetime | None) -> str | None:
    return iso_z(moment) if moment is not None else None


def from_epoch_ms(ms: int) -> str:
    """Milliseconds since the epoch (SQS ``SentTimestamp``) in the same form."""
    return iso_z(datetime.fromtimestamp(ms / 1000, UTC))


def jsonable(value: Any) -> Any:
    """``value`` with every datetime inside (dicts, lists, tuples) formatted by ``iso_z``."""
    if isinstance(value, datetime):
        return iso_z(value)
    if isinstance(value, Mapping):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def json_default(value: Any) -> Any:
    """``json.dumps(..., default=json_default)``: datetimes by ``iso_z``, anything else as text."""
    if isinstance(value, datetime):
        return iso_z(value)
    return str(value)
