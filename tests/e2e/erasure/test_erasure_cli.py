"""`sluice erasure …` and the purge killed for real (os._exit) at its crash points."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

import pytest

from shared.core.crash import CRASH_EXIT_CODE
from shared.core.services import Services
from shared.erasure.purge import count_subject, purge_due
from shared.erasure.requests import ErasureStatus, ErasureStore
from shared.jobs.runs import RunStore
from shared.store.db import utcnow
from tests.conftest import BASE_ENV, REDIS_URL, run_cli
from tests.integration.erasure.erasure_data import seed_redis, seed_subject


@pytest.fixture
def env(db_url: str, redis_prefix: str) -> dict[str, str]:
    return {**BASE_ENV, "SLUICE_DATABASE_URL": db_url, "SLUICE_REDIS_URL": REDIS_URL,
            "SLUICE_REDIS_KEY_PREFIX": redis_prefix}


@pytest.fixture
def svc(env: dict[str, str], make_services: Callable[..., Services]) -> Services:
    return make_services(env["SLUICE_DATABASE_URL"], SLUICE_REDIS_URL=REDIS_URL,
                         SLUICE_REDIS_KEY_PREFIX=env["SLUICE_REDIS_KEY_PREFIX"])


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

    result = purge_due(svc, now=utcnow() + timedelta(minutes=6))
    assert (result["due"], result["resumed"], result["purged"]) == (0, 1, 1)
    assert not any(count_subject(svc, "u1").values())
    assert ErasureStore(svc.db).get(request_id).verified_at is not None


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
    purged = _cli(["confirm", request_id, "--by", "dpo"], env)
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
