"""Who did an admin action is stored as one bounded line of text, on both backends: a token
whose ``sub`` holds an escape sequence and 5,000 characters, and a ``--by`` with terminal
controls, are audited (and marked) as their text with the control characters removed, at
most 200 characters, the same string in every row that names them."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.http.app import create_app
from sluice.jobs.overdue import DisabledMarks
from sluice.jobs.runs import RunStore
from tests.conftest import BASE_ENV, admin_token, run_cli

RAW = "ops\x1b[31m-1\x07\u202e" + "x" * 5000
STORED = ("ops[31m-1" + "x" * 5000)[:200]


def test_an_actor_from_a_token_is_bounded_and_stripped_where_it_is_stored(
        db_url: str, make_services: Callable[..., Services]) -> None:
    svc = make_services(db_url)
    client = TestClient(create_app(svc), raise_server_exceptions=False)
    token = {"authorization": f"Bearer {admin_token(['super_admin'], subject=RAW)}"}

    marked = client.put("/api/admin/jobs/rss-refresh/disabled", headers=token,
                        json={"reason": "paused"})
    refused = client.put("/api/admin/jobs/rss-refresh/disabled", headers=token,
                         json={"reason": ""})

    assert (marked.status_code, refused.status_code) == (200, 400), marked.text
    actors = {r["actor"] for r in RunStore(svc.db).recent_audit()}
    assert actors == {STORED}
    assert DisabledMarks(svc.db).all()["rss-refresh"]["by"] == STORED
    trail = client.get("/api/admin/audit", headers=token).json()["entries"]
    assert {entry["actor"] for entry in trail} == {STORED}


def test_an_actor_from_the_command_line_is_bounded_and_stripped(
        db_url: str, make_services: Callable[..., Services]) -> None:
    svc = make_services(db_url)
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": db_url}

    done = run_cli(["schedule", "disable", "rss-refresh", "--reason", "paused", "--by", RAW], env)

    assert done.returncode == 0, done.stderr
    [row] = [r for r in RunStore(svc.db).recent_audit() if r["action"] == "rss-refresh:disable"]
    assert row["actor"] == STORED
    assert DisabledMarks(svc.db).all()["rss-refresh"]["by"] == STORED
