"""`sluice erasure …` and the purge killed for real (os._exit) at its crash points."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from collections.abc import Callable

import pytest

from sluice.core.crash import CRASH_EXIT_CODE
from sluice.core.services import Services
from sluice.erasure.purge import count_subject, purge_due
from sluice.erasure.requests import ErasureStatus, ErasureStore
from sluice.jobs.runs import RunStore
from sluice.store.db import utcnow
from sluice.store.redis_clients import LEDGER_RETRY_QUEUE
from tests.conftest import BASE_ENV, REDIS_URL, ROOT, run_cli
from tests.integration.billing.usage_data import envelope
from tests.integration.erasure.erasure_data import seed_redis, seed_subject


@pytest.fixture
def env(db_url: str, redis_prefix: str) -> dict[str, str]:
    return {**BASE_ENV, "SLUICE_DATABASE_URL": db_url, "SLUICE_REDIS_URL": REDIS_URL,
            "SLUICE_REDIS_KEY_PREFIX": redis_prefix}


@pytest.fixture
def svc(env: dict[str, str], make_services: Callable[..., Services]) -> Services:
    return make_services(env["SLUICE_DATABASE_URL"], SLUICE_REDIS_URL=REDIS_URL,
                         SLUICE_REDIS_KEY_PREFIX=env["SLUICE_REDIS_KEY_PREFIX"])


def run_on_terminal(args: list[str], env: dict[str, str], typed: str,
                    ) -> subprocess.CompletedProcess[str]:
    """``sluice ARGS`` with a pseudo-terminal as stdin, on which ``typed`` is entered."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "CRON_"))}
    full_env.update(env)
    leader, follower = pty.openpty()
    try:
        with os.fdopen(leader, "wb", buffering=0) as keyboard:
            keyboard.write(typed.encode() + b"\n")
            return subprocess.run([sys.executable, "-m", "sluice.cli.main", *args], env=full_env,
                                  cwd=ROOT, stdin=follower, capture_output=True, text=True,
                                  timeout=120, check=False)
    finally:
        os.close(follower)


def _cli(args: list[str], env: dict[str, str]) -> dict[str, object]:
    done = run_cli(["erasure", *args, "--json"], env)
    assert done.returncode == 0, done.stderr
    body: dict[str, object] = json.loads(done.stdout)
    return body


def test_killed_inside_the_purge_transaction_nothing_is_deleted_and_the_next_run_purges(
        env: dict[str, str], svc: Services) -> None:
    seed_subject(svc.db, "u1")
    seed_redis(svc, "u1")
    request = _cli(["request", "u1", "--grace-days", "0", "--by", "dpo"], env)
    before = count_subject(svc, "u1")
    assert before["ai_usage_ledger"] == 3 and before["platform_state"] == 4

    crashed = run_cli(["run", "erasure-purge", "--json"],
                      {**env, "SLUICE_CRASH_AT": "erasure.in_purge_tx"})

    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert crashed.stdout == ""
    assert count_subject(svc, "u1") == before, "the transaction rolled back: nothing deleted"
    assert ErasureStore(svc.db).get(str(request["id"])).status is ErasureStatus.REQUESTED

    finished = run_cli(["run", "erasure-purge", "--json"], env)
    assert finished.returncode == 0, finished.stderr
    result = json.loads(finished.stdout)
    assert (result["due"], result["purged"], result["failed"]) == (1, 1, 0)
    assert not any(count_subject(svc, "u1").values())

    second = json.loads(run_cli(["run", "erasure-purge", "--json"], env).stdout)
    assert (second["due"], second["purged"]) == (0, 0)


def test_killed_after_the_commit_the_sweep_is_finished_by_a_later_run(
        env: dict[str, str], svc: Services) -> None:
    seed_subject(svc.db, "u1")
    seed_redis(svc, "u1")
    request_id = str(_cli(["request", "u1", "--grace-days", "0"], env)["id"])

    crashed = run_cli(["run", "erasure-purge", "--json"],
                      {**env, "SLUICE_CRASH_AT": "erasure.after_commit"})
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    stranded = ErasureStore(svc.db).get(request_id)
    assert stranded.status is ErasureStatus.PURGED and stranded.verified_at is None
    left = count_subject(svc, "u1")
    assert left["ai_usage_ledger"] == 0 and left["redis:ai:ledger:retry:dlq"] == 2

    result = purge_due(svc, now=utcnow())
    assert (result["due"], result["resumed"], result["purged"]) == (0, 1, 1)
    assert not any(count_subject(svc, "u1").values())
    assert ErasureStore(svc.db).get(request_id).verified_at is not None


def test_killed_after_the_commit_a_redrive_cannot_bring_the_subject_back(
        env: dict[str, str], svc: Services) -> None:
    seed_subject(svc.db, "u1")
    svc.redis.lpush(LEDGER_RETRY_QUEUE, envelope(1, user_id="u1"), envelope(2, user_id="u2"))
    request_id = str(_cli(["request", "u1", "--grace-days", "0"], env)["id"])

    crashed = run_cli(["run", "erasure-purge", "--json"],
                      {**env, "SLUICE_CRASH_AT": "erasure.after_commit"})
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert count_subject(svc, "u1")["redis:ai:ledger:retry:queue"] == 1, "not swept yet"

    # The ledger redrive runs before the next purge: the erased user's entry is dropped.
    redriven = run_cli(["run", "ledger-redrive", "--json"], env)
    assert redriven.returncode == 0, redriven.stderr
    body = json.loads(redriven.stdout)
    assert (body["drained"], body["succeeded"], body["erased"]) == (2, 1, 1)
    assert not any(count_subject(svc, "u1").values()), "nothing of u1 came back"

    # The next purge run finishes the sweep and the verification, with no operator.
    finished = json.loads(run_cli(["run", "erasure-purge", "--json"], env).stdout)
    assert (finished["resumed"], finished["purged"], finished["failed"]) == (1, 1, 0)
    assert ErasureStore(svc.db).get(request_id).verified_at is not None


def test_confirm_refuses_without_yes_when_stdin_is_not_a_terminal(
        env: dict[str, str], svc: Services) -> None:
    seed_subject(svc.db, "u3")
    request_id = str(_cli(["request", "u3"], env)["id"])
    refused = run_cli(["erasure", "confirm", request_id], env, stdin="yes\n")
    assert refused.returncode == 64 and "--yes" in refused.stderr
    assert ErasureStore(svc.db).get(request_id).status is ErasureStatus.REQUESTED
    assert count_subject(svc, "u3")["ai_usage_ledger"] == 3


@pytest.mark.parametrize(("answer", "code", "status"), [
    ("no", 1, ErasureStatus.REQUESTED), ("yes", 0, ErasureStatus.PURGED)])
def test_confirm_asks_on_a_terminal(env: dict[str, str], svc: Services, answer: str, code: int,
                                    status: ErasureStatus) -> None:
    seed_subject(svc.db, "u4")
    request_id = str(_cli(["request", "u4"], env)["id"])
    done = run_on_terminal(["erasure", "confirm", request_id, "--by", "dpo"], env, answer)
    assert done.returncode == code, done.stderr
    assert "cannot be undone" in done.stderr
    assert ErasureStore(svc.db).get(request_id).status is status


def test_the_command_line_lifecycle(env: dict[str, str], svc: Services) -> None:
    seed_subject(svc.db, "u7")
    created = _cli(["request", "u7", "--tenant", "t1", "--by", "dpo"], env)
    assert created["status"] == "requested" and created["requestedBy"] == "dpo"
    assert _cli(["request", "u7"], env)["id"] == created["id"]
    request_id = str(created["id"])

    listed = json.loads(run_cli(["erasure", "list", "--json"], env).stdout)
    assert [r["id"] for r in listed] == [request_id]
    assert _cli(["show", request_id], env)["tenantId"] == "t1"

    dry = _cli(["confirm", request_id, "--dry-run"], env)
    assert dry["wouldPurge"]["ai_usage_ledger"] == 3  # type: ignore[index]
    purged = _cli(["confirm", request_id, "--by", "dpo", "--yes"], env)
    assert purged["status"] == "purged" and purged["confirmedBy"] == "dpo"

    verify = run_cli(["erasure", "verify", "u7", "--json"], env)
    assert verify.returncode == 0 and json.loads(verify.stdout)["clean"] is True
    assert run_cli(["erasure", "purge", "--dry-run", "--json"], env).returncode == 0

    refused = run_cli(["erasure", "cancel", request_id], env)
    assert refused.returncode == 64 and "conflict" in refused.stderr
    missing = run_cli(["erasure", "show", "nope"], env)
    assert missing.returncode == 64 and "no erasure request 'nope'" in missing.stderr
    bad = run_cli(["erasure", "request", "u8", "--grace-days", "-3"], env)
    assert bad.returncode == 64 and "graceDays must be between 0 and 365" in bad.stderr

    actions = {(a["actor"], a["action"]) for a in RunStore(svc.db).recent_audit()}
    assert {("dpo", "erasure:create"), ("dpo", "erasure:confirm")} <= actions


def test_verify_and_registry_check_exit_nonzero_when_something_is_wrong(
        env: dict[str, str], svc: Services) -> None:
    seed_subject(svc.db, "u9", rows=1)
    dirty = run_cli(["erasure", "verify", "u9", "--json"], env)
    assert dirty.returncode == 2 and json.loads(dirty.stdout)["remaining"]["ai_usage_ledger"] == 1

    assert run_cli(["erasure", "registry", "--check"], env).returncode == 0
    with svc.db.transaction() as tx:
        tx.execute("CREATE TABLE profiles (id text PRIMARY KEY, user_id text)")
    check = run_cli(["erasure", "registry", "--check"], env)
    assert check.returncode == 2
    assert "unregistered user column profiles.user_id" in check.stderr
