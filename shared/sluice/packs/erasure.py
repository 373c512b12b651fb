"""The erasure pack: requests purged by erasure-purge once their grace window ends."""

from __future__ import annotations

from sluice.extend import Job, Param

JOBS = [
    Job(name="erasure-purge", route="/api/admin/erasure/purge", schedule="rate(1 hour)",
        surface="erasure", target="sluice.erasure.purge:run_erasure_purge",
        failure_keys=("failed",), budget_s=240.0, timeout_s=300,
        params=(Param("dryRun", "boolean", cron=True),)),
]
