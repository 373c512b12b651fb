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
         "--only", "schedule-without-backoff"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=380, check=False)
    out = done.stdout
    assert "control: seed 2 x 2 days: clean" in done.stderr, done.stderr[-3000:]
    for mutant in ("release-keeps-attempt", "expire-everything-pending"):
        row = re.search(rf"^{mutant}\s+\S+\s+killed\s+no_attempt_burned\s+2\s+(\d+\.\d+)\s",
                        out, re.MULTILINE)
        assert row and float(row.group(1)) < 2, out
    assert re.search(r"^schedule-without-backoff\s+\S+\s+survived", out, re.MULTILINE), out
    assert "2 of 3 mutants detected (67 %; 2 by an invariant), seeds 2 x 2 days" in out
    assert "survived: schedule-without-backoff" in out
    assert done.returncode == 1  # 67 % is below the default --min-kill of 90


def test_an_unknown_mutant_is_refused_before_anything_runs() -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "mutate", "--only", "no-such"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 64 and "unknown mutant(s) no-such" in done.stderr
