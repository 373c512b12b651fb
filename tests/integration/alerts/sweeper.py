"""A sweeper process for the exactly-once test: waits for a line on stdin (so two of them
start together), then sweeps and evaluates the build's stories as new, ``ROUNDS`` times."""

from __future__ import annotations

import json
import sys

from sluice.alerts.evaluate import evaluate_new_stories
from sluice.alerts.sweep import run_alert_sweep
from sluice.core.services import Services
from sluice.jobs.registry import Deadline
from sluice.rss.catalog import peek_scope

ROUNDS = 3


def main() -> None:
    services = Services.from_env()
    sys.stdin.readline()
    enqueued = 0
    for _ in range(ROUNDS):
        enqueued += run_alert_sweep(services, Deadline(60))["enqueued"]
        build = peek_scope(services, "a")
        assert build is not None
        enqueued += evaluate_new_stories(services, build, list(build.stories), ["a"]).enqueued
    print(json.dumps({"enqueued": enqueued}))
    services.close()


if __name__ == "__main__":
    main()
