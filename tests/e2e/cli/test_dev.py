"""``sluice dev``: the quick-start command serves the app, its scheduler fires jobs, and what
it prints is for a person: a line per job run, warnings and errors one line each, and the
logs and metric blobs only with ``-v``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO

import httpx

from sluice.cli.dev import Scheduler
from sluice.core.services import Services
from sluice.jobs.runs import RunStore
from sluice.jobs.schedule import parse
from sluice.store.db import utcnow
from tests.conftest import CRON_SECRET, ROOT, free_port

# A run's line: "07:01:00 delivery-drain on start-up: ok in 512 ms" (a date before the time
# when the run is not today).
JOB_LINE = re.compile(r"^(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d [a-z][\w-]*( on start-up)?: "
                      r"(ok|failures|error|skipped) in \d+ ms")
PERSON_LOG = re.compile(r"^(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d (warning|error): ")


@dataclass
class Dev:
    base: str
    proc: subprocess.Popen[str]
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)

    def wait_for(self, what: str, found: Callable[[], bool], seconds: float = 60) -> None:
        """Poll, with a bound, until ``found()``; a dead server fails at once."""
        deadline = time.monotonic() + seconds
        while not found():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"sluice dev: no {what}\nstdout: {self.out}\n"
                                     f"stderr: {self.err}")
            time.sleep(0.1)


@contextmanager
def sluice_dev(cwd: Path, *args: str) -> Iterator[Dev]:
    """The real ``sluice dev`` on a free 127.0.0.1 port, its database the embedded default
    under ``cwd``; stdout and stderr read line by line as they come."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "CRON_"))}
    env["CRON_SECRET"] = CRON_SECRET
    env["SLUICE_QUEUE_SIGNING_SECRET"] = "dev-test-signing-secret-0123456789"
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli.main", *args, "dev", "--port",
                             str(port)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    dev = Dev(f"http://127.0.0.1:{port}", proc)
    assert proc.stdout is not None and proc.stderr is not None
    readers = [threading.Thread(target=_read, args=(stream, into), daemon=True)
               for stream, into in ((proc.stdout, dev.out), (proc.stderr, dev.err))]
    for reader in readers:
        reader.start()
    try:
        dev.wait_for("answer on /api/health", lambda: _healthy(dev.base))
        yield dev
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for reader in readers:
            reader.join(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


def _read(stream: IO[str], into: list[str]) -> None:
    for line in stream:
        into.append(line.rstrip("\n"))


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/api/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_sluice_dev_serves_on_the_embedded_default_and_prints_for_a_person(
        tmp_path: Path) -> None:
    with sluice_dev(tmp_path) as dev:
        assert httpx.get(f"{dev.base}/api/admin/state/cleanup").status_code == 401
        ok = httpx.get(f"{dev.base}/api/admin/state/cleanup",
                       headers={"authorization": f"Bearer {CRON_SECRET}"})
        assert ok.status_code == 200 and "deletedHashRecords" in ok.json()
        assert (tmp_path / ".sluice" / "sluice.db").exists()
        # the scheduler's first run (the delivery queue's drain on start-up) is one line
        dev.wait_for("job line", lambda: any(JOB_LINE.match(line) for line in dev.out))
        # a forged message pushed to a consumer is an error: one line on stderr
        forged = httpx.post(f"{dev.base}/api/queues/rss/ingest",
                            content=json.dumps({"topic": "rss.ingest", "batchId": "b-1",
                                                "signature": "0" * 64}))
        assert forged.status_code == 200 and forged.json()["outcome"] == "rejected"
        dev.wait_for("error line", lambda: any("rejected" in line for line in dev.err))
    out = "\n".join(dev.out)
    assert f"sluice dev: http://127.0.0.1:{dev.base.rsplit(':', 1)[1]}" in out
    assert re.search(r"^  state-cleanup +next at .*cron\(15 3 \* \* \? \*\)$", out, re.MULTILINE), \
        "the banner gives each job's next run, from its table entry's schedule"
    assert "cron secret  set" in out and "admin auth   not configured" in out
    assert "nonce=" not in out, "no login link without a local admin secret"
    [run] = [line for line in dev.out if JOB_LINE.match(line)]
    assert " delivery-drain on start-up: ok in " in run, run
    # stderr: the one error, as one line a person reads; no log record, metric blob
    # (CloudWatch EMF), traceback or request line
    assert [line for line in dev.err if not PERSON_LOG.match(line)] == []
    [error] = dev.err
    assert "[queues:rss.ingest] rejected" in error, error
    assert ROOT.joinpath("serverless.yml").exists()


def test_sluice_dev_with_v_adds_the_logs_and_metric_blobs(tmp_path: Path) -> None:
    with sluice_dev(tmp_path, "-v") as dev:
        dev.wait_for("job line", lambda: any(JOB_LINE.match(line) for line in dev.out))
        dev.wait_for("metric blob", lambda: any('"_aws"' in line for line in dev.err))
        httpx.get(f"{dev.base}/api/health")
        dev.wait_for("request line",  # uvicorn's access log writes to stdout
                     lambda: any('"GET /api/health' in line for line in dev.out))
    logs = [json.loads(line) for line in dev.err if line.startswith("{")]
    assert any(record.get("message", "").startswith("[delivery-drain] ok in")
               for record in logs), "the runner's structured record of the run"


def test_the_scheduler_fires_due_jobs_once_per_slot(services: Services) -> None:
    said: list[str] = []
    scheduler = Scheduler(services, {"state-cleanup": [parse("rate(1 minute)")]}, said.append)
    start = utcnow()
    assert scheduler.tick(start) == []
    assert scheduler.tick(start + timedelta(seconds=61)) == ["state-cleanup"]
    assert scheduler.tick(start + timedelta(seconds=62)) == []
    for _ in range(200):
        runs = RunStore(services.db).recent("state-cleanup")
        if said and runs and runs[0]["outcome"] != "running":
            break
        time.sleep(0.05)
    [run] = RunStore(services.db).recent("state-cleanup")
    assert (run["trigger"], run["outcome"]) == ("schedule", "ok")
    [line] = said
    assert JOB_LINE.match(line) and " state-cleanup: ok in " in line, line
