"""``sluice publish`` says what happened to the message; ``sluice delivery enqueue`` knows
its channels; ``sluice flags`` writes the audit trail."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from sluice.cli.main import EXIT_FAILURES, EXIT_OK, EXIT_USAGE, main
from sluice.jobs.runs import RunStore
from sluice.queues.handlers import register_catalog_refresh
from sluice.queues.publish import REGISTRY
from sluice.rss.store import RssStore
from sluice.store.db import open_database
from tests.conftest import BASE_ENV, run_cli

SECRET = "queue-signing-secret-0123456789"


@pytest.fixture
def env(db_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {**BASE_ENV, "SLUICE_DATABASE_URL": db_url, "SLUICE_QUEUE_SIGNING_SECRET": SECRET}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def _in_process(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: Any,
                stdin: str = "") -> tuple[int, Any]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def test_publish_reports_a_failed_in_process_consumer_and_exits_2(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    def refresh(services: Any, message: Any) -> None:
        raise RuntimeError("catalog store is down")

    register_catalog_refresh(refresh)
    try:
        assert _in_process(["flags", "rssQueuePipeline", "on"], monkeypatch, capsys)[0] == 0
        code, result = _in_process(["publish", "rss.ingest"], monkeypatch, capsys,
                                   stdin='{"batchId": "b-1"}')
    finally:
        register_catalog_refresh(None)
        REGISTRY.clear()
    assert code == EXIT_FAILURES
    assert result["dispatched"] is False and result["outcome"] == "dead_lettered"
    assert "catalog store is down" in result["reason"]


def test_publish_reports_a_handled_message(env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                           capsys: Any) -> None:
    try:
        code, result = _in_process(["publish", "rss.ingest"], monkeypatch, capsys, stdin="{}")
    finally:
        REGISTRY.clear()
    assert code == EXIT_OK and result["dispatched"] is True and result["outcome"] == "done"


def test_flags_on_and_off_write_one_audit_row_each(env: dict[str, str],
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: Any) -> None:
    _in_process(["flags", "rssQueuePipeline", "on"], monkeypatch, capsys)
    scopes = open_database(env["SLUICE_DATABASE_URL"])
    RssStore(scopes).put_scope("t-1", "tenant-1", (), "en", True)
    scopes.close()
    _in_process(["flags", "rssQueuePipeline", "off", "--tenant", "t-1"], monkeypatch, capsys)
    _in_process(["flags", "rssQueuePipeline", "--tenant", "t-1", "--clear"], monkeypatch, capsys)
    db = open_database(env["SLUICE_DATABASE_URL"])
    rows = RunStore(db).recent_audit()
    db.close()
    assert [(r["action"], r["target"], r["outcome"]) for r in reversed(rows)] == [
        ("flags:set", "rssQueuePipeline", "ok"),
        ("flags:set", "rssQueuePipeline", "override_not_honoured"),  # read globally
        ("flags:set", "rssQueuePipeline", "ok")]
    assert [r["detail"]["enabled"] for r in reversed(rows)] == [True, False, None]
    assert all(r["actor"].startswith("cli:") for r in rows)


def test_enqueue_refuses_an_unknown_channel(env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                            capsys: Any) -> None:
    assert main(["delivery", "enqueue", "pigeon", "someone", "--text", "hi"]) == EXIT_USAGE
    assert "invalid choice: 'pigeon'" in capsys.readouterr().err
    db = open_database(env["SLUICE_DATABASE_URL"])
    with db.transaction() as tx:
        row = tx.fetchone("SELECT count(*) AS n FROM delivery_queue")
    db.close()
    assert row is not None and row["n"] == 0


def test_the_unknown_job_is_a_usage_error_in_a_fresh_process(tmp_path: Path) -> None:
    done = run_cli(["run", "nope"], {"SLUICE_DATABASE_URL": f"sqlite:///{tmp_path}/x.db"})
    assert done.returncode == EXIT_USAGE


def test_enqueue_refuses_a_webhook_aimed_inside_naming_the_recipient(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("SLUICE_WEBHOOK_ALLOW_HOSTS", "")
    for recipient in ("http://169.254.169.254/latest/meta-data/", "http://[::1/x"):
        code = main(["delivery", "enqueue", "webhook", recipient, "--text", "hi"])
        assert code == EXIT_USAGE
        assert "recipient" in capsys.readouterr().err
    db = open_database(env["SLUICE_DATABASE_URL"])
    with db.transaction() as tx:
        row = tx.fetchone("SELECT count(*) AS n FROM delivery_queue")
    db.close()
    assert row is not None and row["n"] == 0
