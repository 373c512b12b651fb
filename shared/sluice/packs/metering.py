"""The metering pack: the metering outbox, flushed to Polar one row at a time."""

from __future__ import annotations

from sluice.extend import Job

JOBS = [
    Job(name="metering-flush", route="/api/admin/ai/metering/flush",
        schedule="rate(5 minutes)", surface="metering",
        target="sluice.billing.metering:run_metering_flush", failure_keys=("failed",),
        budget_s=50.0, timeout_s=60),
]
