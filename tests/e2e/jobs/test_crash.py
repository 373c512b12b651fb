"""Kill a drain for real at a named point (os._exit) and prove nothing is lost."""

from __future__ import annotations

import json
from datetime import timedelta

from sluice.core.crash import CRASH_EXIT_CODE
from sluice.jobs.cleanup import DEFAULT_BATCH_SIZE
from sluice.jobs.runs import RunStore
from sluice.store.db import open_database, utcnow
from tests.conftest import BASE_ENV, run_cli

EXPIRED = DEFAULT_BATCH_SIZE * 2 + 123


def _count(db, where: str) -> int:  # type: ignore[no-untyped-def]
    with db.transaction() as tx:
        row = tx.fetchone(f"SELECT count(*) AS n FROM platform_state WHERE {where}")
    return int(row["n"]) if row else -1


def test_a_cleanup_killed_between_batches_loses_nothing_and_finishes_next_run(
        db_url: str) -> None:
    db = open_database(db_url)
    now = utcnow()
    with db.transaction() as tx:
        tx.executemany(
            "INSERT INTO platform_state (key, value, expires_at, updated_at) "
            "VALUES (:key, '1', :expires_at, :now)",
            [{"key": f"e{i}", "expires_at": now - timedelta(seconds=i + 1), "now": now}
             for i in range(EXPIRED)]
            + [{"key": f"keep{i}", "expires_at": now + timedelta(days=1), "now": now}
               for i in range(50)])
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": db_url}

    crashed = run_cli(["run", "state-cleanup", "--json"],
                      {**env, "SLUICE_CRASH_AT": "state-cleanup.after_state_batch@1"})
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert crashed.stdout == ""
    assert _count(db, "expires_at < CURRENT_TIMESTAMP") == EXPIRED - DEFAULT_BATCH_SIZE
    assert _count(db, "key LIKE 'keep%'") == 50
    [run] = RunStore(db).recent("state-cleanup")
    assert run["outcome"] == "running", "the killed run is visible as never finished"

    # The dead process's lease does not block the next run on this host.
    finished = run_cli(["run", "state-cleanup", "--json"], env)
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout)["deleted"] == EXPIRED - DEFAULT_BATCH_SIZE
    assert _count(db, "1 = 1") == 50
    db.close()
