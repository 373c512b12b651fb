"""`sluice billing reset-attempts`: the way back for rows an outage exhausted, audited."""

from __future__ import annotations

import json

from sluice.billing.metering import IN_FLIGHT_NOTE
from sluice.billing.usage import MAX_METERING_ATTEMPTS, insert_entries
from sluice.jobs.runs import RunStore
from sluice.store.db import Database, open_database
from tests.conftest import BASE_ENV, run_cli
from tests.integration.billing.usage_data import entry

ERRORS = {  # ledger id -> the last error that exhausted it
    "use-00000": "polar 503: upstream unavailable",
    "use-00001": "network: ConnectError: [Errno 111] Connection refused",
    "use-00002": "polar 401: Invalid or expired access token",
    "use-00003": "polar 429: slow down",
    "use-00004": IN_FLIGHT_NOTE,
    "use-00005": "polar 422: external_customer_id: Customer not found",  # refused for good
}


def exhaust(db: Database) -> None:
    insert_entries(db, [entry(i) for i in range(7)])  # use-00006 stays pending
    with db.transaction() as tx:
        for ledger_id, error in ERRORS.items():
            tx.execute("UPDATE ai_usage_metering_outbox SET status = 'failed', "
                       "attempt_count = :n, last_error = :e WHERE ledger_id = :l",
                       {"n": MAX_METERING_ATTEMPTS, "e": error, "l": ledger_id})


def states(db: Database) -> dict[str, tuple[str, int]]:
    with db.transaction() as tx:
        return {r["ledger_id"]: (r["status"], r["attempt_count"])
                for r in tx.fetchall("SELECT * FROM ai_usage_metering_outbox")}


def test_reset_attempts_dry_run_then_for_real_then_by_id(db_url: str) -> None:
    db = open_database(db_url)
    try:
        exhaust(db)
        env = {**BASE_ENV, "SLUICE_DATABASE_URL": db_url}
        before = states(db)

        dry = run_cli(["billing", "reset-attempts", "--dry-run", "--json"], env)
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout) | {"ids": None, "keptIds": None} == {
            "dryRun": True, "reset": 5, "kept": 1, "ids": None, "keptIds": None}
        assert states(db) == before and RunStore(db).recent_audit() == []

        done = run_cli(["billing", "reset-attempts", "--by", "ops-anna", "--json"], env)
        assert done.returncode == 0, done.stderr
        body = json.loads(done.stdout)
        assert sorted(body["ids"]) == sorted(f"{i}:metering" for i in list(ERRORS)[:5])
        after = states(db)
        assert {k: v for k, v in after.items() if k in list(ERRORS)[:5]} == {
            k: ("pending", 0) for k in list(ERRORS)[:5]}
        assert after["use-00005"] == ("failed", MAX_METERING_ATTEMPTS), "refused: kept"
        assert after["use-00006"] == ("pending", 0)
        [audit] = RunStore(db).recent_audit()
        assert (audit["actor"], audit["action"], audit["outcome"]) == (
            "ops-anna", "billing:reset-attempts", "reset")
        assert audit["detail"]["reset"] == 5

        named = run_cli(["billing", "reset-attempts", "--id", "use-00005:metering"], env)
        assert named.returncode == 0 and "reset 1 exhausted row" in named.stdout
        assert states(db)["use-00005"] == ("pending", 0)
        assert len(RunStore(db).recent_audit()) == 2
    finally:
        db.close()
