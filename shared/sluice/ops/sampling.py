"""``history-sample``: one depth sample per measured queue, every minute, on a schedule.

The console's charts used to be fed by whoever opened the console, so a dead letter
that came and went between two visits never showed (a peak of 2 drawn as 1). The
scheduler now samples every queue card once a minute, whether or not anyone looks;
reading the console writes nothing.
"""

from __future__ import annotations

from sluice.jobs.registry import JobContext, Result
from sluice.ops.console import overview, record_depths


def run_history_sample(ctx: JobContext) -> Result:
    data = overview(ctx.services)
    unread = sorted(card["key"] for card in data["cards"] if card["error"])
    sampled = record_depths(ctx.services, data, now=ctx.started_at)
    # A card that cannot be read is a store's trouble, reported on the overview; the
    # sample simply has no point for it, so it is named here and does not page.
    return {"sampled": sampled, "unreadable": unread, "sampledAt": data["generatedAt"]}
