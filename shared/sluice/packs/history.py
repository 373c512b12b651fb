"""The history pack: queue depths and job runs sampled each minute, for the console's charts."""

from __future__ import annotations

from sluice.extend import Job

JOBS = [
    Job(name="history-sample", route="/api/admin/ops/history/sample",
        schedule="rate(1 minute)", surface="queues",
        target="sluice.ops.sampling:run_history_sample", budget_s=20.0, timeout_s=30,
        reads_queues=True),
]
