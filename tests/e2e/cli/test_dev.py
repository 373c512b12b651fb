"""``sluice dev``: the quick-start command serves the app and its scheduler fires jobs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import httpx

from sluice.cli.dev import Scheduler
from sluice.core.services import Services
from sluice.jobs.runs import RunStore
from sluice.jobs.schedule import parse
from sluice.store.db import utcnow
from tests.conftest import CRON_SECRET, ROOT, free_port


def test_sluice_dev_serves_on_the_embedded_default(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "CRON_"))}
    env["CRON_SECRET"] = CRON_SECRET
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli.main", "dev", "--port", str(port)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(f"{base}/api/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise AssertionError("sluice dev did not start")
        assert httpx.get(f"{base}/api/admin/state/cleanup").status_code == 401
        ok = httpx.get(f"{base}/api/admin/state/cleanup",
                       headers={"authorization": f"Bearer {CRON_SECRET}"})
        assert ok.status_code == 200 and "deletedHashRecords" in ok.json()
        assert (tmp_path / ".sluice" / "sluice.db").exists()
    finally:
        proc.terminate()
        output = proc.communicate(timeout=10)[0]
    assert f"sluice dev: http://127.0.0.1:{port}" in output
    assert "state-cleanup next at" in output, "the scheduler fires each job on its table entry's schedule"
    assert "cron secret  set" in output and "admin auth   not configured" in output
    assert "nonce=" not in output, "no login link without a local admin secret"
    assert ROOT.joinpath("serverless.yml").exists()


def test_the_scheduler_fires_due_jobs_once_per_slot(services: Services) -> None:
    scheduler = Scheduler(services, {"state-cleanup": [parse("rate(1 minute)")]})
    start = utcnow()
    assert scheduler.tick(start) == []
    assert scheduler.tick(start + timedelta(seconds=61)) == ["state-cleanup"]
    assert scheduler.tick(start + timedelta(seconds=62)) == []
    for _ in range(200):
        runs = RunStore(services.db).recent("state-cleanup")
        if runs and runs[0]["outcome"] != "running":
            break
        time.sleep(0.05)
    [run] = RunStore(services.db).recent("state-cleanup")
    assert (run["trigger"], run["outcome"]) == ("schedule", "ok")
