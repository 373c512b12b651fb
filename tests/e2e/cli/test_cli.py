"""The sluice command line, run as a real process."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from sluice.jobs.registry import JOBS
from sluice.jobs.runs import RunStore
from sluice.store.db import open_database, utcnow
from sluice.store.state import StateStore
from tests.conftest import BASE_ENV, run_cli


def test_run_json_prints_the_result_alone_on_the_embedded_default(tmp_path: Path) -> None:
    # No SLUICE_DATABASE_URL: the embedded default ./.sluice/sluice.db. Only migrate (or dev)
    # creates it; any other command refuses to start a new empty store here.
    refused = run_cli(["run", "state-cleanup", "--json"], {}, cwd=tmp_path)
    assert refused.returncode == 78
    assert json.loads(refused.stdout)["error"]["code"] == "configuration_error"
    assert f"no SQLite database at {tmp_path / '.sluice' / 'sluice.db'}" in refused.stderr
    assert "sluice migrate" in refused.stderr
    assert not (tmp_path / ".sluice").exists()

    assert run_cli(["migrate"], {}, cwd=tmp_path).returncode == 0
    done = run_cli(["run", "state-cleanup", "--json"], {}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) == {"deleted", "deletedHashRecords", "deletedSamples", "deletedFeedCaches",
                           "deletedBuildLocks", "deletedJobRuns", "deletedAuditRecords",
                           "deletedDestinations", "deletedRateLimits", "processedAt", "failed",
                           "errors"}
    assert done.stderr == "", "logs and metrics only with -v"
    human = run_cli(["run", "state-cleanup"], {}, cwd=tmp_path)
    assert f"database: sqlite {tmp_path / '.sluice' / 'sluice.db'}" in human.stderr
    assert human.stdout.splitlines()[0] == "state-cleanup: ok"
    verbose = run_cli(["run", "state-cleanup", "--json", "-v"], {}, cwd=tmp_path)
    assert json.loads(verbose.stdout) and '"_aws"' in verbose.stderr, "metric blobs with -v"


def test_run_human_summary_and_records(pg_url: str) -> None:
    db = open_database(pg_url)
    StateStore(db).put("gone", 1, expires_at=utcnow() - timedelta(seconds=1))
    done = run_cli(["run", "state-cleanup"], {**BASE_ENV, "SLUICE_DATABASE_URL": pg_url})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "state-cleanup: ok"
    assert "  deleted: 1" in done.stdout.splitlines()
    assert RunStore(db).recent("state-cleanup")[0]["trigger"] == "cli"
    db.close()


def test_unknown_job_and_bad_settings_fail_clearly(tmp_path: Path) -> None:
    done = run_cli(["run", "nope"], {}, cwd=tmp_path)
    assert done.returncode == 64 and "no job named 'nope'" in done.stderr, "a usage error"
    done = run_cli(["run", "state-cleanup"], {"CRON_SECRET": "short"}, cwd=tmp_path)
    assert done.returncode == 78 and "CRON_SECRET" in done.stderr, "a configuration error"
    done = run_cli(["frobnicate"], {}, cwd=tmp_path)
    assert done.returncode == 64 and "invalid choice" in done.stderr
    done = run_cli(["run"], {}, cwd=tmp_path)
    assert done.returncode == 64


def test_migrate_and_jobs(tmp_path: Path) -> None:
    env = {"SLUICE_DATABASE_URL": f"sqlite:///{tmp_path}/m.db"}
    dry = run_cli(["migrate", "--dry-run"], env)
    assert "pending 0001 foundation" in dry.stdout
    done = run_cli(["migrate"], env)
    assert done.returncode == 0 and "applied 0001 foundation" in done.stdout
    assert run_cli(["migrate"], env).stdout.strip().endswith("0 migration(s) applied on sqlite")
    run_cli(["run", "state-cleanup", "--json"], env)
    listing = json.loads(run_cli(["jobs", "--json"], env).stdout)
    assert {row["job"] for row in listing} == set(JOBS)
    [cleanup] = [row for row in listing if row["job"] == "state-cleanup"]
    assert cleanup["lastOutcome"] == "ok" and cleanup["schedule"] == "cron(15 3 * * ? *)"
