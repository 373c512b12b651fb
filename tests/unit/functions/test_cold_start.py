"""Handler modules initialise with the cyclic GC paused and leave it running afterwards.

Each case runs in a fresh interpreter: what a handler module does to the collector is
process-wide, and the test process must not be the one it happens to.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import gc, json, sys
import functions  # the package's own init (its imports run before any cold_start)
seen = []
importing = [True]
gc.callbacks.append(lambda phase, info: phase == "start" and importing[0]
                    and seen.append(info["generation"]))
error = None
try:
    __import__(sys.argv[1])
except Exception as exc:
    error = type(exc).__name__
importing[0] = False
print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
                  "collections_during_import": seen, "error": error}))
"""


def probe(module: str, env: dict[str, str]) -> dict[str, object]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "AWS_"))}
    # as in the Lambda zip: ``sluice`` found on the path (shared/), not through the editable
    # install's finder
    base["PYTHONPATH"] = str(ROOT / "shared")
    done = subprocess.run([sys.executable, "-c", PROBE, module], cwd=ROOT, check=True,
                          capture_output=True, text=True, env={**base, **env}, timeout=120)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    return {"SLUICE_DATABASE_URL": f"sqlite:///{tmp_path / 'sluice.db'}",
            "SLUICE_CRON_SECRET": "c" * 32, "SLUICE_QUEUE_SIGNING_SECRET": "s" * 32}


@pytest.mark.parametrize(("module", "extra"), [
    ("functions.cron", {"SLUICE_JOB": "state-cleanup"}),
    ("functions.consumers", {"SLUICE_TOPIC": "rss.ingest"}),
    ("functions.http", {}),
])
def test_init_runs_without_collections_then_freezes_and_reenables_the_gc(
        module: str, extra: dict[str, str], base_env: dict[str, str]) -> None:
    result = probe(module, {**base_env, **extra})
    assert result["error"] is None, result
    assert result["enabled"] is True
    # at most one young-generation pass before the module's cold_start pauses the collector
    collections = result["collections_during_import"]
    assert isinstance(collections, list) and set(collections) <= {0} and len(collections) <= 1, \
        result
    assert isinstance(result["frozen"], int) and result["frozen"] > 10_000, result


def test_a_failed_init_leaves_the_gc_running_and_freezes_nothing_of_its_own(
        base_env: dict[str, str]) -> None:
    loaded = probe("functions.cron", {**base_env, "SLUICE_JOB": "state-cleanup"})
    result = probe("functions.cron", base_env)  # no SLUICE_JOB: the module refuses to load
    assert result["error"] == "ConfigurationError", result
    assert result["enabled"] is True
    # only the package's completed secret-load init is frozen, not the module's partial one
    assert isinstance(result["frozen"], int) and isinstance(loaded["frozen"], int)
    assert 0 < result["frozen"] < loaded["frozen"] * 0.8, (result, loaded)
