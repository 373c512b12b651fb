"""Postgres dropping the connection mid-run (``pg_terminate_backend``): a typed error,
nothing half-applied, and the next run finishes the work."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from sluice.billing.usage import insert_entries
from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.jobs.registry import JOBS
from sluice.jobs.runner import run_job
from sluice.store.db import PostgresDatabase, Query, open_database
from sluice.store.redis_clients import LEDGER_RETRY_PROCESSING, LEDGER_RETRY_QUEUE, RedisClient
from tests.conftest import BASE_ENV
from tests.integration.billing.usage_data import entry, envelope
from tests.providers.polar import PolarStandIn

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


class _KillingTx:
    def __init__(self, tx: Any, owner: KillingDatabase) -> None:
        self._tx = tx
        self._owner = owner
        self.dialect = tx.dialect

    def json(self, value: Any) -> Any:
        return self._tx.json(value)

    def _maybe_kill(self, query: Query | str) -> None:
        if isinstance(query, Query) and query.name == self._owner.target and self._owner.armed:
            self._owner.armed = False
            pid = self._tx.fetchone("SELECT pg_backend_pid() AS pid")["pid"]
            with psycopg.connect(self._owner.conninfo, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            self._owner.killed += 1

    def execute(self, query: Query | str, params: Any = None, *, final: bool = False) -> int:
        self._maybe_kill(query)
        return int(self._tx.execute(query, params, final=final))

    def write(self, query: Query | str, params: Any = None) -> None:
        self._maybe_kill(query)
        self._tx.write(query, params)

    def executemany(self, query: Query | str, params: Any) -> None:
        self._maybe_kill(query)
        self._tx.executemany(query, params)

    def fetchall(self, query: Query | str, params: Any = None, *, final: bool = False) -> Any:
        self._maybe_kill(query)
        return self._tx.fetchall(query, params, final=final)

    def fetchone(self, query: Query | str, params: Any = None, *, final: bool = False) -> Any:
        self._maybe_kill(query)
        return self._tx.fetchone(query, params, final=final)


class KillingDatabase:
    """The real Postgres, except that the first run of query ``target`` finds its own
    backend terminated, in the middle of the transaction."""

    dialect = "postgres"

    def __init__(self, db: PostgresDatabase, target: str) -> None:
        self.db = db
        self.conninfo = db.conninfo
        self.target = target
        self.armed = True
        self.killed = 0

    @contextmanager
    def transaction(self) -> Iterator[_KillingTx]:
        with self.db.transaction() as tx:
            yield _KillingTx(tx, self)

    def close(self) -> None:
        self.db.close()


@pytest.fixture
def pg(pg_url: str) -> Iterator[PostgresDatabase]:
    database = open_database(pg_url)
    assert isinstance(database, PostgresDatabase)
    yield database
    database.close()


def services_on(db: Any, **env: str) -> Services:
    settings = Settings.from_env({**BASE_ENV, "SLUICE_DATABASE_URL": "postgresql://unused/x",
                                  **env})
    return Services(settings, db, Reporter())


def counts(pg: PostgresDatabase) -> tuple[int, int]:
    with pg.transaction() as tx:
        ledger = tx.fetchone("SELECT count(*) AS n FROM ai_usage_ledger")
        outbox = tx.fetchone("SELECT count(*) AS n FROM ai_usage_metering_outbox")
    return int(ledger["n"]), int(outbox["n"])  # type: ignore[index]


def test_redrive_insert_killed_mid_transaction(pg: PostgresDatabase, redis_env: dict[str, str],
                                               redis_client: RedisClient) -> None:
    redis_client.lpush(LEDGER_RETRY_QUEUE, *[envelope(i) for i in range(40)])
    killing = KillingDatabase(pg, "write_usage")  # in the transaction, before its statement
    services = services_on(killing, **redis_env)
    outcome = run_job(JOBS["ledger-redrive"], services, "cli")
    assert killing.killed == 1
    # an outage pages through the store alarms, not as drain failures: only deadLettered does
    assert outcome.status == 200 and outcome.outcome == "ok"
    assert outcome.body["reason"] == "store_unavailable"
    assert outcome.body["requeued"] == 40 and outcome.body["succeeded"] == 0
    [error] = outcome.body["errors"]
    assert error.startswith("store_unavailable: ")
    assert counts(pg) == (0, 0), "the ledger rows of the killed transaction were rolled back"
    assert {json.loads(raw)["attempts"] for raw in redis_client.lrange(LEDGER_RETRY_QUEUE, 0, -1)} \
        == {0}, "a store that failed counts no attempt"

    again = run_job(JOBS["ledger-redrive"], services, "cli")
    assert again.outcome == "ok" and again.body["succeeded"] == 40
    assert counts(pg) == (40, 40)
    assert redis_client.llen(LEDGER_RETRY_QUEUE) == redis_client.llen(LEDGER_RETRY_PROCESSING) == 0
    services.redis.close()


def test_metering_mark_killed_mid_transaction(pg: PostgresDatabase, polar: PolarStandIn) -> None:
    insert_entries(pg, [entry(i) for i in range(5)])
    killing = KillingDatabase(pg, "mark_and_claim_one_outbox")
    env = {"POLAR_ACCESS_TOKEN": polar.token, "POLAR_API_URL": polar.url}
    outcome = run_job(JOBS["metering-flush"], services_on(killing, **env), "cli")
    assert killing.killed == 1
    assert outcome.status == 500
    assert outcome.body["error"]["code"] == "internal_error"
    assert outcome.body["error"]["cause"] == "store_unavailable"
    with pg.transaction() as tx:
        states = sorted((r["status"], r["attempt_count"]) for r in
                        tx.fetchall("SELECT status, attempt_count FROM ai_usage_metering_outbox"))
    assert states == [("failed", 1)] + [("pending", 0)] * 4, \
        "the claim stands; neither the mark nor the next claim landed"

    again = run_job(JOBS["metering-flush"], services_on(pg, **env), "cli")
    assert again.body == {"processed": 5, "failed": 0, "skipped": 0, "reason": None}
    assert polar.received["use-00000:metering"] == 2 and len(polar.events) == 5
