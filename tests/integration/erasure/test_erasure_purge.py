"""erasure-purge on both backends with the real Redis: lifecycle, purge, verification, dry run."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import sluice.erasure.requests as erasure_module
from sluice.core.errors import Conflict, TransientStoreError
from sluice.core.services import Services
from sluice.erasure.purge import SYSTEM_ACTOR, confirm, count_subject, purge_due
from sluice.erasure.registry import TARGETS, RedisJsonLists
from sluice.erasure.requests import ErasureStatus, ErasureStore
from sluice.jobs.registry import Deadline, get_job
from sluice.jobs.runner import run_job
from sluice.jobs.runs import RunStore
from sluice.store.db import utcnow
from tests.conftest import REDIS_URL
from tests.integration.erasure.erasure_data import (
    DECOY_KEYS,
    count,
    delivery_rows,
    redis_entries,
    seed_redis,
    seed_subject,
)

JOB = get_job("erasure-purge")


@pytest.fixture
def svc(db_url: str, redis_prefix: str, make_services: Callable[..., Services]) -> Services:
    return make_services(db_url, SLUICE_REDIS_URL=REDIS_URL, SLUICE_REDIS_KEY_PREFIX=redis_prefix)


def _seed(svc: Services, subject: str = "u1") -> None:
    seed_subject(svc.db, subject)
    seed_redis(svc, subject)


def _due(svc: Services, subject: str = "u1") -> str:
    request, created = ErasureStore(svc.db).create(subject, requested_by="admin-1", grace_days=0)
    assert created
    return request.id


def test_a_due_request_leaves_nothing_of_the_subject_and_spares_everyone_else(
        svc: Services) -> None:
    _seed(svc)
    request_id = _due(svc)
    before = count_subject(svc, "u10")

    outcome = run_job(JOB, svc, "cli")

    assert outcome.outcome == "ok", outcome.body
    body = outcome.body
    assert (body["due"], body["purged"], body["failed"]) == (1, 1, 0)
    [result] = body["results"]
    assert result["id"] == request_id and result["status"] == "purged"
    assert result["tables"] == {
        "ai_usage_metering_outbox": 4, "ai_usage_ledger": 3, "platform_state": 4,
        "platform_state_hash": 4, "alert_rules": 0, "admin_audit.actor": 1,
        **delivery_rows(svc.db),
        "data_erasure_requests.requested_by": 0, "data_erasure_requests.confirmed_by": 0,
        "redis:ai:ledger:retry:queue": 2, "redis:ai:ledger:retry:processing": 2,
        "redis:ai:ledger:retry:dlq": 2,
    }
    assert not any(count_subject(svc, "u1").values())
    # The decoys: u10 (same prefix), U1 (other case), lookalike key segments.
    assert count_subject(svc, "u10") == before
    for template in DECOY_KEYS:
        key = template.format(s="u1", S="U1")
        assert count(svc.db, "SELECT count(*) AS n FROM platform_state WHERE key = :k",
                     {"k": key}) == 1, key
    for entries in redis_entries(svc).values():
        assert "not json" in entries and len(entries) == 3
    # The audit trail keeps the action, not the person.
    assert count(svc.db, "SELECT count(*) AS n FROM admin_audit WHERE actor = :a AND ip IS NULL",
                 {"a": f"erased:{request_id}"}) == 1
    [kept] = [r for r in RunStore(svc.db).recent_audit(500)
              if r["actor"] == f"erased:{request_id}"]
    assert kept["detail"] == {"requestId": "r"}, "the forwarded address went with the actor"

    stored = ErasureStore(svc.db).get(request_id)
    assert stored.status is ErasureStatus.PURGED and stored.confirmed_by == SYSTEM_ACTOR
    assert stored.verified_at is not None and stored.purged_at is not None
    assert stored.result is not None and stored.result["tables"]["ai_usage_ledger"] == 3
    assert stored.result["remaining"] == {}

    again = run_job(JOB, svc, "cli")
    assert (again.body["due"], again.body["purged"], again.body["results"]) == (0, 0, [])


def test_the_dry_run_counts_per_table_and_changes_nothing(svc: Services) -> None:
    _seed(svc)
    request_id = _due(svc)
    before = count_subject(svc, "u1")

    outcome = run_job(JOB, svc, "admin", params={"dryRun": "true"})

    assert outcome.body["dryRun"] is True and outcome.body["due"] == 1
    assert outcome.body["purged"] == 0
    [result] = outcome.body["results"]
    assert result["status"] == "would_purge" and result["tables"] == before
    assert result["tables"]["ai_usage_ledger"] == 3
    assert count_subject(svc, "u1") == before
    assert ErasureStore(svc.db).get(request_id).status is ErasureStatus.REQUESTED


def test_the_grace_window_holds_a_request_back_until_it_ends(svc: Services) -> None:
    _seed(svc)
    store = ErasureStore(svc.db)
    now = utcnow()
    request, _ = store.create("u1", requested_by="admin-1", grace_days=7, now=now)
    assert request.grace_until == now + timedelta(days=7)

    assert purge_due(svc, now=now + timedelta(days=6))["due"] == 0
    assert count_subject(svc, "u1")["ai_usage_ledger"] == 3
    result = purge_due(svc, now=now + timedelta(days=7))
    assert (result["due"], result["purged"]) == (1, 1)


def test_a_request_cancelled_between_list_and_purge_is_skipped_not_failed(
        svc: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    _seed(svc)
    request_id = _due(svc)
    listed = ErasureStore.due

    def list_then_cancel(self: ErasureStore, now: Any, limit: int = 100) -> Any:
        due = listed(self, now, limit)
        ErasureStore(svc.db).cancel(request_id)  # the operator, concurrently
        return due

    monkeypatch.setattr(ErasureStore, "due", list_then_cancel)
    outcome = run_job(JOB, svc, "cli")

    assert outcome.outcome == "ok"
    assert (outcome.body["due"], outcome.body["purged"], outcome.body["failed"],
            outcome.body["skipped"]) == (1, 0, 0, 1)
    assert outcome.body["results"] == [{"id": request_id, "status": "skipped", "tables": {}}]
    assert count_subject(svc, "u1")["ai_usage_ledger"] == 3


class _RacingRedrive:
    """An external store whose sweep races the ledger redrive: a row lands after the commit."""

    name = "racing"

    def __init__(self, svc: Services) -> None:
        self.svc = svc

    def count(self, redis: Any, subject: str) -> dict[str, int]:
        return {}

    def purge(self, redis: Any, subject: str) -> dict[str, int]:
        with self.svc.db.transaction() as tx:
            tx.execute("INSERT INTO ai_usage_ledger (id, user_id, model, occurred_at) "
                       "VALUES ('late', :u, 'gpt', :now)", {"u": subject, "now": utcnow()})
        return {}


def test_data_left_after_the_purge_fails_the_request_and_pages(
        svc: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    _seed(svc)
    request_id = _due(svc)
    monkeypatch.setattr("sluice.erasure.purge.EXTERNAL_STORES", (_RacingRedrive(svc),))
    reported: list[tuple[str, int]] = []
    monkeypatch.setattr(svc.reporter, "drain_failures",
                        lambda job, failed, result: reported.append((job, failed)))

    outcome = run_job(JOB, svc, "schedule")

    assert outcome.outcome == "failures"
    assert (outcome.body["purged"], outcome.body["failed"]) == (0, 1)
    assert outcome.body["results"][0]["remaining"] == {"ai_usage_ledger": 1}
    assert reported == [("erasure-purge", 1)]
    stored = ErasureStore(svc.db).get(request_id)
    assert stored.status is ErasureStatus.FAILED
    assert stored.last_error == "personal data remained after the purge: ai_usage_ledger=1"

    # The operator retries a failed request once the cause is gone.
    monkeypatch.undo()
    current, retried = confirm(svc, request_id, confirmed_by="admin-2")
    assert retried.status == "purged" and retried.tables["ai_usage_ledger"] == 1
    assert current.status is ErasureStatus.PURGED and current.last_error is None
    assert current.confirmed_by == "admin-2"


def test_an_unreachable_redis_after_the_commit_fails_the_request(
        svc: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    seed_subject(svc.db, "u1")
    request_id = _due(svc)

    def down(self: RedisJsonLists, redis: Any, subject: str) -> dict[str, int]:
        raise TransientStoreError("redis: connection refused")

    monkeypatch.setattr(RedisJsonLists, "purge", down)
    result = purge_due(svc, now=utcnow())

    assert result["failed"] == 1
    stored = ErasureStore(svc.db).get(request_id)
    assert stored.status is ErasureStatus.FAILED
    assert stored.last_error is not None and "connection refused" in stored.last_error
    assert count_subject(svc, "u1")["ai_usage_ledger"] == 0, "the SQL purge had committed"


def test_confirm_purges_now_and_refuses_a_cancelled_or_purged_request(svc: Services) -> None:
    _seed(svc)
    store = ErasureStore(svc.db)
    request, _ = store.create("u1", requested_by="admin-1", grace_days=30)

    preview_request, preview = confirm(svc, request.id, confirmed_by="admin-2", dry_run=True)
    assert preview.tables["ai_usage_ledger"] == 3
    assert preview_request.status is ErasureStatus.REQUESTED

    current, outcome = confirm(svc, request.id, confirmed_by="admin-2")
    assert outcome.status == "purged" and current.status is ErasureStatus.PURGED
    with pytest.raises(Conflict, match="purged"):
        confirm(svc, request.id, confirmed_by="admin-2")

    cancelled, _ = store.create("u2", requested_by="admin-1", grace_days=30)
    store.cancel(cancelled.id)
    with pytest.raises(Conflict, match="cancelled"):
        confirm(svc, cancelled.id, confirmed_by="admin-2")
    with pytest.raises(Conflict, match="only a requested one"):
        store.cancel(cancelled.id)


def test_an_operator_who_is_the_subject_is_pseudonymised_too(svc: Services) -> None:
    store = ErasureStore(svc.db)
    request, _ = store.create("op-7", requested_by="op-7", grace_days=0)
    current, outcome = confirm(svc, request.id, confirmed_by="op-7")
    assert outcome.status == "purged", outcome
    alias = f"erased:{request.id}"
    assert (current.requested_by, current.confirmed_by) == (alias, alias)
    assert current.subject_user_id == "op-7", "the request row is the record of the erasure"


def test_a_second_open_request_for_the_subject_returns_the_first(svc: Services) -> None:
    store = ErasureStore(svc.db)
    first, created = store.create("u1", requested_by="a", grace_days=3)
    second, created_again = store.create("u1", requested_by="b", grace_days=0, tenant_id="t9")
    assert created and not created_again and second == first
    store.cancel(first.id)
    third, created_third = store.create("u1", requested_by="b", grace_days=0)
    assert created_third and third.id != first.id
    assert [r.id for r in store.list(subject="u1")] == [third.id, first.id]
    assert [r.id for r in store.list(status=ErasureStatus.CANCELLED)] == [first.id]


def test_requests_run_serially_in_grace_order(svc: Services) -> None:
    store = ErasureStore(svc.db)
    now = utcnow()
    ids = []
    for i, subject in enumerate(("a", "b", "c")):
        seed_subject(svc.db, subject, rows=1)
        request, _ = store.create(subject, requested_by="x", grace_days=0,
                                  now=now - timedelta(minutes=3 - i))
        ids.append(request.id)
    result = purge_due(svc, now=now)
    assert [r["id"] for r in result["results"]] == ids
    assert json.loads(json.dumps(result))["purged"] == 3


def test_every_target_counts_and_purges_on_this_backend(svc: Services) -> None:
    counts = count_subject(svc, "nobody")
    assert set(counts) >= {t.name for t in TARGETS}
    assert not any(counts.values())


def test_a_target_whose_table_is_not_migrated_yet_is_skipped(svc: Services) -> None:
    _seed(svc)
    request_id = _due(svc)
    with svc.db.transaction() as tx:
        tx.execute("DROP TABLE ai_usage_metering_outbox")
    result = purge_due(svc, now=utcnow())
    assert result["purged"] == 1, result
    assert "ai_usage_metering_outbox" not in result["results"][0]["tables"]
    assert result["results"][0]["tables"]["ai_usage_ledger"] == 3
    assert ErasureStore(svc.db).get(request_id).verified_at is not None


def test_a_run_out_of_time_defers_what_it_did_not_reach(svc: Services) -> None:
    _seed(svc)
    request_id = _due(svc)
    result = purge_due(svc, now=utcnow(), deadline=Deadline(0))
    assert (result["due"], result["purged"], result["deferred"]) == (1, 0, 1)
    assert ErasureStore(svc.db).get(request_id).status is ErasureStatus.REQUESTED
    assert purge_due(svc, now=utcnow())["purged"] == 1


class _BlindFirstLook:
    """The erasure queries, except that the first look for an open request sees none:
    another create commits between our check and our insert."""

    def __init__(self) -> None:
        self.looked = False

    def __getattr__(self, name: str) -> Any:
        if name == "open_request_for_subject" and not self.looked:
            self.looked = True
            return "SELECT * FROM data_erasure_requests WHERE 1 = 0"
        return getattr(erasure_module.load_queries("erasure"), name)


def test_a_concurrent_create_for_the_same_subject_returns_the_winner(
        svc: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    winner, _ = ErasureStore(svc.db).create("u1", requested_by="a", grace_days=1)
    monkeypatch.setattr(erasure_module, "Q", _BlindFirstLook())
    loser, created = ErasureStore(svc.db).create("u1", requested_by="b", grace_days=0)
    assert not created and loser == winner
    assert len(ErasureStore(svc.db).list(subject="u1")) == 1
