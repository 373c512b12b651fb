"""``python -m bench scale --json`` end to end, reduced (a few builds, a few hundred
entries, two consumers and two senders): every row is printed with its ratio, nothing
is built twice, no entry is sent twice or lost, no attempt is burned by a 429. Speed is
the benchmark's business, not this test's: it asserts no figure of time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
REDUCED = {"SLUICE_BENCH_SCALE_RSS_SETS": "6", "SLUICE_BENCH_SCALE_RSS_SCOPES": "12",
           "SLUICE_BENCH_SCALE_RSS_CONSUMERS": "1,2",
           "SLUICE_BENCH_SCALE_DELIVERY_ENTRIES": "240",
           "SLUICE_BENCH_SCALE_DELIVERY_SENDERS": "1,2",
           "SLUICE_BENCH_SCALE_DELIVERY_IN_FLIGHT": "4"}


@pytest.mark.timeout(600)
def test_the_reduced_scale_benchmark_prints_its_rows_with_no_duplicate_or_loss() -> None:
    # the services' addresses (SLUICE_TEST_*) pass; no other Sluice setting does
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLUICE_") or k.startswith("SLUICE_TEST_")} | REDUCED
    done = subprocess.run([sys.executable, "-m", "bench", "scale", "--json"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    rows = {r["benchmark"]: r for r in json.loads(done.stdout)}
    for consumers in (1, 2):
        assert rows[f"scale rss: speed-up, {consumers} consumer(s)"]["ratio"] is not None
    for senders in (1, 2):
        row = rows[f"scale delivery: {senders} sender(s), delivered/s"]
        assert row["baseline"] == 230.0 and row["sluice"] > 0
    # the notes (on stderr's table, printed as each part ends and again at the end) say
    # what each run left behind
    built_twice = re.findall(r"built twice: (\d+)", done.stderr)
    assert len(built_twice) >= 2 and set(built_twice) == {"0"}, done.stderr[-3000:]
    counts = re.findall(r"(\d) in flight each; 240 entries in [\d.]+ s; 429s \d+, "
                        r"duplicates (\d+), lost (\d+), attempts burned (\d+)", done.stderr)
    assert set(counts) == {("4", "0", "0", "0"), ("2", "0", "0", "0")}, done.stderr[-3000:]
