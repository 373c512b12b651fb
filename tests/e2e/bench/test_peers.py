"""``python -m bench peers --json`` end to end, reduced (300 jobs a side, DBOS 100): every
peer runs through its own API on its own fresh database beside Sluice, every side's jobs
are all counted done in its own tables (a side short of N fails the run), and each row
carries its ratio. Speed is the benchmark's business: this test asserts no figure of time,
only that the command still measures what docs/benchmarks.md says it does."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PEERS = {"Postgres": ["pgqueuer", "procrastinate", "dbos"],
         "SQLite": ["dbos", "huey", "persist-queue"]}


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLUICE_") or k.startswith("SLUICE_TEST_")}
    return subprocess.run([sys.executable, "-m", "bench", "peers", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=840, check=False)


@pytest.mark.postgres
@pytest.mark.timeout(900)
def test_the_reduced_peers_benchmark_measures_every_peer_beside_sluice() -> None:
    done = _bench("--n", "300", "--n-for", "dbos=100", "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    rows = {r["benchmark"]: r for r in json.loads(done.stdout)}
    new_python = sys.version_info >= (3, 12)
    # DBOS's SQLite schema needs SQLite 3.42+ on Python 3.12+; Oban needs Python 3.12+
    dbos_on_sqlite = not new_python or sqlite3.sqlite_version_info >= (3, 42)
    peers = {"Postgres": [*PEERS["Postgres"], *(["oban"] if new_python else [])],
             "SQLite": [p for p in PEERS["SQLite"] if p != "dbos" or dbos_on_sqlite]}
    for store, names in peers.items():
        for peer in names:
            for measure in ("processed/s", "enqueue/s one call a job",
                            "p50 enqueue to completion", "p99 enqueue to completion"):
                found = rows[f"peers: {measure}, {store} vs {peer}"]
                assert found["sluice"] > 0 and found["baseline"] > 0, found
                assert found["ratio"] is not None and found["ratio"] > 0, found
        machine = rows[f"peers: Sluice processed/s vs the machine's commits/s, {store}"]
        assert machine["baseline"] > 0 and 0 < machine["ratio"], machine
    if not new_python:  # the package needs 3.12: its row says so, the run passes
        assert "not measured: oban needs Python 3.12+" in done.stderr, done.stderr[-3000:]
    # the side-by-side table (stderr with --json) names each side's N
    dbos = re.findall(r"^dbos +100 ", done.stderr, re.MULTILINE)
    assert len(dbos) == (2 if dbos_on_sqlite else 1), done.stderr[-3000:]


def test_a_side_not_known_to_the_benchmark_is_refused_by_name() -> None:
    done = _bench("--n-for", "celery=10")
    assert done.returncode == 2
    assert "--n-for wants SIDE=N with a known side, got 'celery=10'" in done.stderr
