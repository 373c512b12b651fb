"""``python -m bench mutate`` end to end, reduced: the unmutated tree (the control) runs
clean, two catalog defects are killed by the invariant meant for them (with the seed and
the simulated day that caught them), one that a two-day run cannot reach survives and is
reported, and the kill rate below ``--min-kill`` exits 1. The full catalog's run is in
docs/reliability.md (``python -m bench mutate --jobs 2``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


# About 65 s on a busy two-core machine (control 15 s, three mutants).
@pytest.mark.timeout(400)
def test_a_reduced_mutation_run_kills_its_defects_and_reports_the_survivor() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    done = subprocess.run(
        [sys.executable, "-m", "bench", "mutate", "--seed", "2", "--days", "2",
         "--only", "release-keeps-attempt", "--only", "expire-everything-pending",
         "--only", "lapsed-lease-resent-always"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=380, check=False)
    out = done.stdout
    assert "control: seed 2 x 2 days: clean" in done.stderr, done.stderr[-3000:]
    for mutant in ("release-keeps-attempt", "expire-everything-pending"):
        row = re.search(rf"^{mutant}\s+\S+\s+killed\s+no_attempt_burned\s+2\s+(\d+\.\d+)\s",
                        out, re.MULTILINE)
        assert row and float(row.group(1)) < 2, out
    assert re.search(r"^lapsed-lease-resent-always\s+\S+\s+survived", out, re.MULTILINE), out
    assert "2 of 3 mutants detected (67 %; 2 by an invariant), seeds 2 x 2 days" in out
    assert "survived: lapsed-lease-resent-always" in out
    assert done.returncode == 1  # 67 % is below the default --min-kill of 90


def test_an_unknown_mutant_is_refused_before_anything_runs() -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "mutate", "--only", "no-such"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 64 and "unknown mutant(s) no-such" in done.stderr


# About 15 s: the control and six defects, each caught within the first simulated day.
@pytest.mark.timeout(300)
def test_the_oracles_of_issue_36_kill_their_defects_within_a_day() -> None:
    """A receiver's own signature check, the story's text, the consumer's backoff and
    attempts, Polar's deduplication: each defect is killed by the invariant meant for it."""
    wanted = {"webhook-timestamp-in-ms": "webhook_signed",
              "alert-payload-without-link": "content_intact",
              "consumer-backoff-flat": "queue_backoff",
              "consumer-dead-letters-at-three": "queue_no_attempt_burned",
              "metering-external-id-per-send": "metered_once",
              "webhook-new-key-per-send": "webhook_signed"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    only = [arg for mutant in wanted for arg in ("--only", mutant)]
    done = subprocess.run(
        [sys.executable, "-m", "bench", "mutate", "--seed", "1", "--days", "1", "--jobs", "2",
         *only], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280, check=False)
    out = done.stdout
    assert "control: seed 1 x 1 days: clean" in done.stderr, done.stderr[-3000:]
    for mutant, invariant in wanted.items():
        assert re.search(rf"^{mutant}\s+\S+\s+killed\s+{invariant}\s+1\s+0\.\d+\s", out,
                         re.MULTILINE), out
    assert "6 of 6 mutants detected (100 %; 6 by an invariant), seeds 1 x 1 days" in out
    assert done.returncode == 0
