"""Graceful shutdown as deployed: the cron function, started as Lambda starts it (a fresh
interpreter, ``AWS_LAMBDA_RUNTIME_API`` set), registers its internal extension against a
stand-in of the runtime API that speaks the documented Extensions API, and the Shutdown
phase's SIGTERM ends a delivery's in-process retry wait at once: the run records its end
and lets its lease go."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice.core.shutdown import EXTENSION_NAME, register_extension
from sluice.delivery.store import DeliveryStore
from sluice.jobs.runs import RunStore
from sluice.store.db import open_database
from tests.conftest import BASE_ENV, ROOT, free_port, load_event
from tests.providers.lambda_runtime import RuntimeApi
from tests.providers.webhook import WebhookReceiver

SECRET = "shutdown-webhook-secret-0123456789"
# The server asks for a 25 s wait: the retrier takes it in-process, the rate wait (the
# longest a send waits in process) raised to 30 s for this run.
RETRY_AFTER_S = 25
RUNTIME = """
import json, sys
from tests.lambda_context import LambdaContext
import functions.cron as cron
answer = cron.handler(json.loads(sys.argv[1]), LambdaContext())
print(json.dumps({"outcome": answer["outcome"], "body": answer["body"]}))
"""


def _until(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigterm_in_the_shutdown_phase_ends_the_wait_and_the_run_records_its_end(
        db_url: str, tmp_path: Path) -> None:
    db = open_database(db_url)
    with RuntimeApi() as runtime, WebhookReceiver(SECRET) as hook:
        hook.answers = [(503, {"Retry-After": str(RETRY_AFTER_S)})]
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "AWS_"))},
               **BASE_ENV, "SLUICE_DATABASE_URL": db_url, "SLUICE_JOB": "delivery-drain",
               "SLUICE_WEBHOOK_SIGNING_SECRET": SECRET,
               "SLUICE_DELIVERY_RATE_WAIT_SECONDS": "30",
               "AWS_LAMBDA_RUNTIME_API": runtime.address}
        from sluice.store.migrate import migrate

        migrate(db)
        entry, _ = DeliveryStore(db).enqueue("webhook", hook.url, {"text": "hi"})
        process = subprocess.Popen(
            [sys.executable, "-c", RUNTIME, json.dumps(load_event("scheduled_event"))],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # GIVEN the extension registered during init and waits in event/next
            assert runtime.waiting.acquire(timeout=60), "the extension never called event/next"
            [registration] = runtime.registered.values()
            assert registration == {"name": EXTENSION_NAME, "events": []}
            # AND the run is in the retry wait the 503's Retry-After asked for
            _until(lambda: hook.received, "the first send")
            time.sleep(0.5)  # into the wait
            assert process.poll() is None, "the run is in its retry wait"
            # WHEN Lambda's Shutdown phase comes
            began = time.monotonic()
            runtime.shutdown(process.pid)
            out, err = process.communicate(timeout=60)
            took = time.monotonic() - began
        finally:
            process.kill()
    # THEN the wait ended at once (a run that slept it through takes 25 s more)
    assert runtime.sigterm_sent and process.returncode == 0, err
    assert took < RETRY_AFTER_S - 10, took
    answer = json.loads(out.strip().splitlines()[-1])
    assert answer["outcome"] in ("ok", "failures"), answer
    # AND the run recorded its end and let its lease go
    [run] = RunStore(db).recent("delivery-drain")
    assert run["finished_at"] is not None and run["outcome"] == answer["outcome"]
    assert run["duration_ms"] < (RETRY_AFTER_S - 5) * 1000, run
    with db.transaction() as tx:
        assert tx.fetchall("SELECT job FROM job_leases WHERE job = 'delivery-drain'") == []
    # AND the delivery waits for a later run: one send, no resend in-process, not lost
    assert len(hook.received) == 1
    assert DeliveryStore(db).get(entry.id).status.value == "pending"
    db.close()


def test_no_runtime_api_or_a_refusal_leaves_the_function_running_without_it() -> None:
    assert register_extension(None) is None  # not on Lambda: nothing to register with
    assert register_extension(f"127.0.0.1:{free_port()}") is None  # nobody listening
    with RuntimeApi() as runtime:
        assert register_extension(runtime.address, name="") is None  # refused: 400
        identifier = register_extension(runtime.address)
        assert identifier in runtime.registered
        assert runtime.waiting.acquire(timeout=30)
