"""Kill metering-flush and ledger-redrive for real (``sluice run`` in a subprocess, os._exit at
a named point) and prove that the next run loses nothing and counts nothing twice."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sluice.billing.usage import insert_entries
from sluice.core.crash import CRASH_EXIT_CODE
from sluice.store.db import Database, open_database
from sluice.store.redis_clients import (
    LEDGER_RETRY_DLQ,
    LEDGER_RETRY_PROCESSING,
    LEDGER_RETRY_QUEUE,
    RedisClient,
)
from tests.conftest import BASE_ENV, run_cli
from tests.integration.billing.usage_data import entry, envelope
from tests.providers.polar import PolarStandIn

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def pg(pg_url: str) -> Iterator[Database]:
    database = open_database(pg_url)
    yield database
    database.close()


def test_metering_killed_after_the_send_resends_that_row_once(pg_url: str, pg: Database,
                                                              polar: PolarStandIn) -> None:
    insert_entries(pg, [entry(i) for i in range(6)])
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": pg_url, "POLAR_ACCESS_TOKEN": polar.token,
           "POLAR_API_URL": polar.url}

    crashed = run_cli(["run", "metering-flush", "--json"],
                      {**env, "SLUICE_CRASH_AT": "metering.after_send@3"})
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert polar.requests == 3
    with pg.transaction() as tx:
        state = {r["ledger_id"]: (r["status"], r["attempt_count"])
                 for r in tx.fetchall("SELECT * FROM ai_usage_metering_outbox")}
    assert state["use-00001"] == ("processed", 1)
    assert state["use-00002"] == ("failed", 1), "in flight when the process died"
    assert state["use-00003"] == ("pending", 0)

    finished = run_cli(["run", "metering-flush", "--json"], env)
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout) == {"processed": 4, "failed": 0, "skipped": 0,
                                           "reason": None}
    assert polar.received == {f"use-{i:05d}:metering": 2 if i == 2 else 1 for i in range(6)}
    assert len(polar.events) == 6, "Polar deduplicated the re-sent event on external_id"
    with pg.transaction() as tx:
        rows = tx.fetchall("SELECT status, attempt_count FROM ai_usage_metering_outbox")
    assert sorted((r["status"], r["attempt_count"]) for r in rows) == \
        [("processed", 1)] * 5 + [("processed", 2)]


@pytest.mark.parametrize("point", ["redrive.after_claim", "redrive.after_insert",
                                   "redrive.before_ack"])
def test_redrive_killed_anywhere_loses_nothing(pg_url: str, pg: Database, point: str,
                                               redis_env: dict[str, str],
                                               redis_client: RedisClient) -> None:
    items = [envelope(i) for i in range(60)] + ["{not json", '{"id": 7}']
    redis_client.lpush(LEDGER_RETRY_QUEUE, *items)
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": pg_url, **redis_env}

    crashed = run_cli(["run", "ledger-redrive", "--json"], {**env, "SLUICE_CRASH_AT": point})
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert redis_client.llen(LEDGER_RETRY_PROCESSING) == len(items), "claimed, not lost"

    finished = run_cli(["run", "ledger-redrive", "--json"], env)
    assert finished.returncode == 2, finished.stderr  # the two malformed entries are reported
    result = json.loads(finished.stdout)
    assert (result["drained"], result["succeeded"], result["deadLettered"]) == (62, 60, 2)
    with pg.transaction() as tx:
        ledger = [r["id"] for r in tx.fetchall("SELECT id FROM ai_usage_ledger ORDER BY id")]
        outbox = [r["ledger_id"] for r in tx.fetchall(
            "SELECT ledger_id FROM ai_usage_metering_outbox ORDER BY ledger_id")]
    assert ledger == outbox == [f"use-{i:05d}" for i in range(60)]
    assert redis_client.llen(LEDGER_RETRY_QUEUE) == 0
    assert redis_client.llen(LEDGER_RETRY_PROCESSING) == 0
    dead = sorted(json.loads(d)["reason"] for d in redis_client.lrange(LEDGER_RETRY_DLQ, 0, -1))
    assert dead == ["malformed: no string id", "malformed: not JSON"]
