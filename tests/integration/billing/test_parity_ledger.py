"""ledger-redrive as the reference documents describe it, run as the job through the job
runner against the real Redis (over redis-py and over the Upstash REST stand-in) and
Postgres: an insert that could not reach Postgres parked by the app's ``record_usage`` and
written by the job, the three lists by their names, the reclaim first, the idempotent
insert, batches of 100, and the DLQ after ten refusals."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from sluice.billing.usage import insert_entries
from sluice.core.services import Services
from sluice.jobs.registry import JOBS
from sluice.jobs.runner import RunOutcome, run_job
from sluice.public.app import record_usage
from sluice.store.redis_clients import RedisClient
from tests.conftest import free_port
from tests.integration.billing.test_ledger_redrive import enqueue, ledger_ids, poison
from tests.integration.billing.usage_data import entry, envelope

pytestmark = [pytest.mark.redis]
# The lists by the names producers in other languages push to and read from.
QUEUE, PROCESSING, DLQ = ("ai:ledger:retry:queue", "ai:ledger:retry:processing",
                          "ai:ledger:retry:dlq")


def redrive(services: Services, **params: str) -> RunOutcome:
    outcome = run_job(JOBS["ledger-redrive"], services, "admin" if params else "cli",
                      params=params)
    assert outcome.status == 200, outcome.body
    return outcome


def test_an_insert_that_missed_postgres_waits_in_redis_and_the_job_writes_it(
        pg_url: str, redis_env: dict[str, str], redis_client: RedisClient,
        make_services: Callable[..., Services]) -> None:
    down = make_services(f"postgresql://postgres@127.0.0.1:{free_port()}/none", **redis_env)
    assert record_usage(down, entry(4)) == "queued"
    assert [json.loads(raw)["id"] for raw in redis_client.lrange(QUEUE, 0, -1)] == ["use-00004"]
    services = make_services(pg_url, **redis_env)
    body = redrive(services).body
    assert (body["drained"], body["succeeded"]) == (1, 1)
    assert ledger_ids(services.db) == ["use-00004"]
    assert redis_client.llen(QUEUE) == 0


def test_the_run_reclaims_the_processing_list_first_then_takes_batches_of_100(
        pg_url: str, redis_env: dict[str, str], redis_client: RedisClient,
        make_services: Callable[..., Services]) -> None:
    """Eight entries stranded on the processing list by a run that died after its claim, and
    150 waiting: a run of one batch takes the stranded eight first, then the oldest 92."""
    enqueue(redis_client, [envelope(i) for i in range(8, 158)])
    stranded = [envelope(i) for i in range(8)]
    for raw in stranded:
        redis_client.lpush(PROCESSING, raw)
    services = make_services(pg_url, **redis_env)
    body = redrive(services, batches="1").body
    assert (body["drained"], body["succeeded"]) == (100, 100)
    assert ledger_ids(services.db) == [f"use-{i:05d}" for i in range(100)]
    assert (redis_client.llen(PROCESSING), redis_client.llen(QUEUE)) == (0, 58)


def test_an_entry_already_in_the_ledger_is_not_counted_again(
        pg_url: str, redis_env: dict[str, str], redis_client: RedisClient,
        make_services: Callable[..., Services]) -> None:
    services = make_services(pg_url, **redis_env)
    insert_entries(services.db, [entry(1)])
    enqueue(redis_client, [envelope(1), envelope(1), envelope(2)])
    body = redrive(services).body
    assert (body["drained"], body["succeeded"]) == (3, 3)
    assert ledger_ids(services.db) == ["use-00001", "use-00002"]
    with services.db.transaction() as tx:
        row = tx.fetchone("SELECT count(*) AS n FROM ai_usage_metering_outbox")
    assert row is not None and row["n"] == 2, "one outbox row per ledger row"


def test_an_entry_refused_ten_times_moves_to_the_dlq_and_pages(
        pg_url: str, redis_env: dict[str, str], redis_client: RedisClient,
        make_services: Callable[..., Services]) -> None:
    services = make_services(pg_url, **redis_env)
    poison(services.db)
    enqueue(redis_client, [envelope(1, model="poison")])
    for run in range(1, 10):
        outcome = redrive(services)
        assert (outcome.body["deadLettered"], outcome.outcome) == (0, "ok"), run
        assert redis_client.llen(QUEUE) == 1
    tenth = redrive(services)
    assert (tenth.body["deadLettered"], tenth.outcome) == (1, "failures")
    assert (redis_client.llen(QUEUE), redis_client.llen(DLQ)) == (0, 1)
    assert json.loads(redis_client.lrange(DLQ, 0, -1)[0])["id"] == "use-00001"
