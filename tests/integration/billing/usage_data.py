"""Ledger entries and retry envelopes for the AI usage tests (fixtures: conftest.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sluice.billing.usage import RetryEnvelope, UsageEntry

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def entry(i: int, **changes: Any) -> UsageEntry:
    fields: dict[str, Any] = {"id": f"use-{i:05d}", "model": "gpt-4.1-mini",
                              "occurred_at": T0 + timedelta(seconds=i), "tenant_id": f"t{i % 3}",
                              "user_id": f"u{i}", "input_tokens": 100 + i, "output_tokens": 20,
                              "cost_micros": 1_000 + i}
    fields.update(changes)
    return UsageEntry(**fields)


def envelope(i: int, *, attempts: int = 0, **changes: Any) -> str:
    env = RetryEnvelope.for_entry(entry(i, **changes), last_error="store_unavailable: down",
                                  now=T0)
    data = json.loads(env.to_json())
    data["attempts"] = attempts
    return json.dumps(data, separators=(",", ":"))
