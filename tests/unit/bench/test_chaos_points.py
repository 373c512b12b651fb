"""Crash points are found by reading the source, and the sweep's table prints its figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos.kill import SCENARIOS, Tally
from bench.chaos.main import table
from bench.chaos.points import discover, points_in


def test_literal_and_forwarded_point_names_are_found() -> None:
    source = '''
from sluice.core.crash import crash_point

def batches(point):
    crash_point(point)

def run():
    crash_point("job.after_claim")
    batches(point="job.after_batch")
    batches(point="job.after_other_batch")
'''
    assert points_in(source) == {"job.after_claim", "job.after_batch", "job.after_other_batch"}


@pytest.mark.parametrize("source", [
    "crash_point(f'x.{n}')",
    "crash_point()",
    "def f(point):\n    crash_point(point)\n",
])
def test_a_point_whose_name_cannot_be_read_is_an_error(source: str) -> None:
    with pytest.raises(ValueError):
        points_in(source)


# Crash points an operator's action reaches, not a job's run: each is killed for real by a
# test of its own (the sweep seeds a job's workload and runs the job).
OWN_KILL_TESTS = {
    "replay.after_page": ("tests/e2e/delivery/test_delivery_replay.py",
                          "def test_a_replay_killed_part_way_leaves_its_audit_row_holding_its_count"),
}


def test_every_crash_point_in_shared_has_a_seeded_scenario() -> None:
    found = discover()
    assert "metering.after_send" in found and "state-cleanup.after_hash_batch" in found
    prefixes = tuple(scenario.prefix for scenario in SCENARIOS)
    assert [name for name in found
            if not name.startswith(prefixes) and name not in OWN_KILL_TESTS] == []
    root = Path(__file__).parents[3]
    for name, (path, test) in OWN_KILL_TESTS.items():
        text = (root / path).read_text()
        assert test in text and f'"{name}@' in text, name


def test_the_table_has_the_promised_columns_and_counts_unexpected_duplicates() -> None:
    tally = Tally("kill: metering-flush [sqlite]", runs=3, reached=2, duplicated=2, unexpected=0)
    printed = table([tally, Tally("kill: x", runs=1, stuck=1)])
    lines = printed.splitlines()
    assert lines[0] == ("| scenario | runs | lost | duplicated effects | stuck | "
                        "attempts burned by faults |")
    assert lines[2] == "| kill: metering-flush [sqlite] | 3 (2 killed) | 0 | 2 (0 unexpected) | 0 | 0 |"
    assert not tally.bad and Tally("y", unexpected=1).bad
