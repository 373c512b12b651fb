"""The delivery queue killed for real (os._exit) at its crash points: nothing is lost, a send
whose ack was lost is repeated once with the same idempotency key, and `sluice dev` drains
what a dead process left behind as it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sluice.core.crash import CRASH_EXIT_CODE
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.store.db import open_database
from sluice.store.migrate import migrate
from tests.conftest import BASE_ENV, free_port, run_cli
from tests.providers.telegram import TelegramStandIn
from tests.providers.webhook import WebhookReceiver

SECRET = "webhook-secret-for-tests-0123456789"
LEASE_S = 1


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver(SECRET) as hook:
        yield hook


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return {**BASE_ENV, "SLUICE_DATABASE_URL": db_url, "SLUICE_WEBHOOK_SIGNING_SECRET": SECRET,
            "SLUICE_DELIVERY_LEASE_SECONDS": str(LEASE_S)}


def _json(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert done.returncode == 0, done.stderr
    body: dict[str, object] = json.loads(done.stdout)
    return body


def seed(result: dict[str, object]) -> dict[str, object]:
    """The seed's four counts of a drain result."""
    return {k: result[k] for k in ("recovered", "failed", "skippedMaxRetries", "deferredBackoff")}


def _store(env: dict[str, str]) -> DeliveryStore:
    return DeliveryStore(open_database(env["SLUICE_DATABASE_URL"]))


@pytest.mark.parametrize("path", ["drain", "inline"])
def test_killed_after_the_send_before_the_ack_the_entry_is_sent_again_once(
        path: str, env: dict[str, str], receiver: WebhookReceiver) -> None:
    enqueue = ["delivery", "enqueue", "webhook", receiver.url, "--text", "disk full",
               "--key", "alert:disk:1", "--json"]
    crash = {**env, "SLUICE_CRASH_AT": "delivery.after_send"}
    if path == "drain":
        entry_id = str(_json(run_cli(enqueue, env))["id"])
        crashed = run_cli(["run", "delivery-drain", "--json"], crash)
    else:
        crashed = run_cli([*enqueue, "--send"], crash)
        [entry] = _store(env).list()
        entry_id = entry.id
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert crashed.stdout == ""
    assert len(receiver.received) == 1, "the send happened"
    stranded = _store(env).get(entry_id)
    assert stranded.status is DeliveryStatus.IN_FLIGHT and stranded.attempts == 1

    time.sleep(LEASE_S + 0.2)
    result = _json(run_cli(["run", "delivery-drain", "--json"], env))

    assert seed(result) == {"recovered": 1, "failed": 0, "skippedMaxRetries": 0,
                            "deferredBackoff": 0}
    assert [r["key"] for r in receiver.received] == ["alert:disk:1", "alert:disk:1"]
    assert list(receiver.delivered) == ["alert:disk:1"], "the receiver dedupes the repeat"
    done = _store(env).get(entry_id)
    assert done.status is DeliveryStatus.ACKED and done.attempts == 2
    again = _json(run_cli(["run", "delivery-drain", "--json"], env))
    assert again["recovered"] == 0 and len(receiver.received) == 2, "sent again exactly once"


def test_killed_after_the_enqueue_before_the_send_the_drain_sends_it(
        env: dict[str, str], receiver: WebhookReceiver) -> None:
    crashed = run_cli(["delivery", "enqueue", "webhook", receiver.url, "--text", "hello",
                       "--send", "--json"], {**env, "SLUICE_CRASH_AT": "delivery.after_enqueue"})
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert receiver.received == []
    [entry] = _store(env).list()
    assert entry.status is DeliveryStatus.IN_FLIGHT, "stored before the send: not lost"

    time.sleep(LEASE_S + 0.2)
    result = _json(run_cli(["run", "delivery-drain", "--json"], env))

    assert seed(result) == {"recovered": 1, "failed": 0, "skippedMaxRetries": 0,
                            "deferredBackoff": 0}
    assert [r["body"] for r in receiver.received] == [{"text": "hello"}]
    assert _store(env).get(entry.id).status is DeliveryStatus.ACKED


def test_a_poison_entry_that_kills_every_drain_before_its_send_fails_unsent(
        env: dict[str, str], receiver: WebhookReceiver) -> None:
    entry_id = str(_json(run_cli(["delivery", "enqueue", "webhook", receiver.url, "--text",
                                  "poison", "--json"], env))["id"])
    crash = {**env, "SLUICE_CRASH_AT": "delivery.after_claim"}
    for _ in range(5):
        assert run_cli(["run", "delivery-drain", "--json"], crash).returncode == CRASH_EXIT_CODE
        time.sleep(LEASE_S + 0.1)
    last = run_cli(["run", "delivery-drain", "--json"], crash)
    assert last.returncode == 2, "not reached again: the run ends, reporting one failure"
    assert json.loads(last.stdout)["unknown"] == 0, "no request ever left: not an unknown"
    assert json.loads(last.stdout)["failed"] == 1
    dead = _store(env).get(entry_id)
    assert (dead.status, dead.attempts, dead.failure_reason) == (
        DeliveryStatus.FAILED, 0, "lease_lost"), "no attempt was ever made"
    assert "not sent (5 in a row)" in (dead.last_error or "")
    assert receiver.received == []


def test_sluice_dev_drains_the_queue_on_start_up(tmp_path: Path,
                                                 receiver: WebhookReceiver) -> None:
    db_path = tmp_path / ".sluice" / "sluice.db"
    db = open_database(f"sqlite:///{db_path}")
    migrate(db)
    DeliveryStore(db).enqueue("webhook", receiver.url, {"text": "left behind"})
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "CRON_"))}
    env.update(BASE_ENV, SLUICE_WEBHOOK_SIGNING_SECRET=SECRET)
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli.main", "dev", "--port", str(port)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(150):
            if receiver.delivered:
                break
            time.sleep(0.1)
        assert httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=5).status_code == 200
    finally:
        proc.terminate()
        output = proc.communicate(timeout=10)[0]
    assert [r["body"] for r in receiver.received] == [{"text": "left behind"}], output
    assert "delivery-drain on start-up" in output
    [entry] = DeliveryStore(db).list()
    assert entry.status is DeliveryStatus.ACKED


def test_killed_between_two_chunks_the_next_drain_resumes_after_the_accepted_one(
        env: dict[str, str]) -> None:
    # GIVEN a message in 3 chunks and a sender killed right after chunk 1 was accepted
    with TelegramStandIn() as telegram:
        chat_env = {**env, "SLUICE_TELEGRAM_BOT_TOKEN": telegram.token,
                    "SLUICE_TELEGRAM_API_URL": telegram.url,
                    "SLUICE_TELEGRAM_CHAT_RATE_PER_SECOND": "1000"}
        entry, _ = _store(env).enqueue("telegram", "1001",
                                       {"payloads": ["one", "two", "three"]})
        crashed = run_cli(["run", "delivery-drain", "--json"],
                          {**chat_env, "SLUICE_CRASH_AT": "delivery.after_chunk"})
        assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
        assert [m["text"] for m in telegram.messages] == ["one"]

        # WHEN its lease lapses and a drain runs (a lapsed lease: the unknown rule)
        time.sleep(LEASE_S + 0.2)
        result = _json(run_cli(["run", "delivery-drain", "--json"], chat_env))

        # THEN it resumes at chunk 2: every chunk arrived exactly once
        assert result["recovered"] == 1
        assert [m["text"] for m in telegram.messages] == ["one", "two", "three"]
        done = _store(env).get(entry.id)
        assert done.status is DeliveryStatus.ACKED and done.platform_message_id == "1,2,3"


RUN_DRAIN_UNDER_SIGTERM = """
import json, sys
from sluice.core.shutdown import install
from sluice.core.services import Services
from sluice.jobs.registry import get_job
from sluice.jobs.runner import run_job
install()  # as a Lambda handler module does at init
services = Services.from_env()
outcome = run_job(get_job("delivery-drain"), services, "schedule")
print(json.dumps({"status": outcome.status, "body": outcome.body}))
"""


def test_sigterm_during_a_send_in_flight_ends_the_run_within_lambdas_window(
        env: dict[str, str], receiver: WebhookReceiver) -> None:
    # GIVEN a drain whose send is in flight to a receiver that answers only much later
    store = _store(env)
    entry, _ = store.enqueue("webhook", receiver.url, {"text": "slow"})
    later, _ = store.enqueue("webhook", receiver.url, {"text": "next in its turn"})
    receiver.slow = 1
    drain = subprocess.Popen([sys.executable, "-c", RUN_DRAIN_UNDER_SIGTERM],
                             env={**os.environ, **env, "SLUICE_DELIVERY_LEASE_SECONDS": "120",
                                  "SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS": "30"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(200):  # the request has arrived: the send is in flight
            if receiver.received:
                break
            time.sleep(0.05)
        assert receiver.received, "the send never left"

        # WHEN Lambda stops the environment: SIGTERM, then a kill 500 ms later
        terminated = time.monotonic()
        drain.terminate()
        out, err = drain.communicate(timeout=10)
        took = time.monotonic() - terminated
    finally:
        receiver.release.set()
        drain.kill()

    # THEN the run ended in time, recorded, its lease released, the entry not in flight
    assert took < 2.0, f"exited {took:.2f} s after SIGTERM (Lambda allows 0.5 s): {err}"
    assert drain.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["body"]["unknown"] == 1, "sent, no answer: an unknown outcome"
    cut = store.get(entry.id)
    assert cut.status is DeliveryStatus.PENDING and cut.unknown_sends == 1
    assert store.get(later.id).status is DeliveryStatus.PENDING, "never sent: its turn lapsed"
    assert store.get(later.id).attempts == 0
    assert len(receiver.received) == 1
    db = open_database(env["SLUICE_DATABASE_URL"])
    with db.transaction() as tx:
        leases = tx.fetchall("SELECT * FROM job_leases WHERE job = 'delivery-drain'")
        running = tx.fetchall("SELECT * FROM job_runs WHERE job = 'delivery-drain' "
                              "AND outcome = 'running'")
    assert not running, "the run is recorded as ended"
    assert not leases, "its lease released: the next run starts at once"


def test_killed_inside_a_round_its_marked_entries_are_unknown_then_sent_never_acked_twice(
        env: dict[str, str]) -> None:
    """Three webhook receivers (three rate keys: one round): the drain marks the three
    leaving in one statement, sends the first and dies before the round's settle. All
    three are in flight with their requests marked left (write-ahead: an unknown outcome,
    never "not sent"); the next drain resends each once (the receivers deduplicate) and
    acks each once; nothing is lost."""
    with WebhookReceiver(SECRET) as a, WebhookReceiver(SECRET) as b, \
            WebhookReceiver(SECRET) as c:
        hooks = [a, b, c]
        ids = [str(_json(run_cli(["delivery", "enqueue", "webhook", hook.url, "--text",
                                  f"m{n}", "--key", f"round:{n}", "--json"], env))["id"])
               for n, hook in enumerate(hooks)]
        crashed = run_cli(["run", "delivery-drain", "--json"],
                          {**env, "SLUICE_CRASH_AT": "delivery.after_send@1"})
        assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
        assert sum(len(h.received) for h in hooks) == 1, "killed after the round's first send"
        store = _store(env)
        stranded = [store.get(entry_id) for entry_id in ids]
        assert all(e.status is DeliveryStatus.IN_FLIGHT and e.attempts == 1
                   and e.request_left_at is not None for e in stranded), stranded

        time.sleep(LEASE_S + 0.2)
        result = _json(run_cli(["run", "delivery-drain", "--json"], env))

        assert result["recovered"] == 3 and result["failed"] == 0
        done = [store.get(entry_id) for entry_id in ids]
        assert all(e.status is DeliveryStatus.ACKED and e.unknown_sends == 1 for e in done)
        assert sorted(len(h.received) for h in hooks) == [1, 1, 2], "at most the round again"
        assert [list(h.delivered) for h in hooks] == [[f"round:{n}"] for n in range(3)]
        again = _json(run_cli(["run", "delivery-drain", "--json"], env))
        assert again["recovered"] == 0, "each acknowledged once"
