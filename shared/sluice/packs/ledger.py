"""The ledger pack: the AI usage ledger's Redis retry lists, redriven into Postgres."""

from __future__ import annotations

from sluice.extend import Job, Param

JOBS = [
    Job(name="ledger-redrive", route="/api/admin/ai/ledger/retry/flush",
        schedule="rate(5 minutes)", surface="ledger",
        target="sluice.billing.ledger_redrive:run_ledger_redrive",
        # Only lost entries page: a store outage leaves every entry queued (its reason and
        # errors say so), and "not configured" is not a failure.
        failure_keys=("deadLettered",), budget_s=50.0, timeout_s=60,
        params=(Param("batches", "integer", minimum=1, maximum=1_000),)),
]
