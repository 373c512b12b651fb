"""Replay by destination and window over HTTP and the command line, on both backends: roles,
typed 400s (exit 64) naming the field, a dry run that changes and audits nothing, and one
audit row per real run with who, the filter and the count; judged by what the Telegram
stand-in received."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.core.crash import CRASH_EXIT_CODE
from sluice.core.services import Services
from sluice.delivery.store import DeliveryEntry, DeliveryStatus, DeliveryStore
from sluice.http.app import create_app
from sluice.jobs.runs import RunStore
from sluice.store.db import utcnow
from tests.conftest import BASE_ENV, ROOT, admin_token, load_event, process_env, run_cli
from tests.e2e.jobs.test_lambda import fresh_import
from tests.integration.delivery.bulk import insert_failed
from tests.lambda_context import LambdaContext
from tests.providers.telegram import TelegramStandIn

URL = "/api/admin/delivery/replay"
CHAT = "telegram:1001"


def ops() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['ops'], subject='ops-1')}"}


@pytest.fixture
def telegram() -> Iterator[TelegramStandIn]:
    with TelegramStandIn(chats=("1001", "1003")) as stand_in:
        yield stand_in


@pytest.fixture
def env(db_url: str, telegram: TelegramStandIn) -> dict[str, str]:
    return {**BASE_ENV, "SLUICE_DATABASE_URL": db_url,
            "SLUICE_TELEGRAM_BOT_TOKEN": telegram.token,
            "SLUICE_TELEGRAM_API_URL": telegram.url,
            # the chat's rate (one a second) is the limiter's to test: wide here
            "SLUICE_TELEGRAM_CHAT_RATE_PER_SECOND": "1000"}


@pytest.fixture
def svc(env: dict[str, str], make_services: Callable[..., Services]) -> Services:
    return make_services(env["SLUICE_DATABASE_URL"],
                         **{k: v for k, v in env.items() if k.startswith("SLUICE_TELEGRAM")})


@pytest.fixture
def client(svc: Services) -> TestClient:
    return TestClient(create_app(svc), raise_server_exceptions=False)


def failed_and_acked(svc: Services, failed: int, acked: int) -> list[DeliveryEntry]:
    """``failed`` entries of chat 1001 failed for good, ``acked`` ones delivered, and a
    failed one of another chat; the failed ones of 1001."""
    store = DeliveryStore(svc.db)
    entries = [store.enqueue("telegram", "1001", {"text": f"m{i}"})[0]
               for i in range(failed + acked)]
    other = store.enqueue("telegram", "1003", {"text": "other chat"})[0]
    with svc.db.transaction() as tx:
        for entry in [*entries[:failed], other]:
            tx.execute("UPDATE delivery_queue SET status = 'failed', failure_reason = "
                       "'permanent', failed_at = :now, attempts = 1 WHERE id = :id",
                       {"id": entry.id, "now": utcnow()})
        for entry in entries[failed:]:
            tx.execute("UPDATE delivery_queue SET status = 'acked', acked_at = :now, "
                       "attempts = 1 WHERE id = :id", {"id": entry.id, "now": utcnow()})
    return entries[:failed]


def since() -> str:
    return (utcnow() - timedelta(hours=1)).isoformat()


def replay_rows(svc: Services) -> list[dict[str, Any]]:
    return [row for row in RunStore(svc.db).recent_audit(200)
            if row["action"] == "delivery:replay"]


def detail_of(row: dict[str, Any]) -> dict[str, Any]:
    detail = row["detail"]
    return json.loads(detail) if isinstance(detail, str) else dict(detail)


def test_over_http_a_dry_run_then_one_audited_replay(
        client: TestClient, svc: Services, telegram: TelegramStandIn) -> None:
    failed = failed_and_acked(svc, 3, 2)
    body = {"destination": CHAT, "since": since()}

    dry = client.post(URL, json={**body, "dryRun": True}, headers=ops())
    assert dry.status_code == 200, dry.text
    assert (dry.json()["count"], dry.json()["alreadyAcknowledged"]) == (3, 2)
    assert dry.json()["dryRun"] is True
    assert {DeliveryStore(svc.db).get(e.id).status for e in failed} == {DeliveryStatus.FAILED}
    assert replay_rows(svc) == [], "a dry run is not an action: no audit row"

    done = client.post(URL, json=body, headers=ops())
    assert done.status_code == 200, done.text
    assert (done.json()["count"], done.json()["dryRun"]) == (3, False)
    [row] = replay_rows(svc)
    detail = detail_of(row)
    assert (row["actor"], row["outcome"], row["target"]) == ("ops-1", "200", URL)
    assert detail["count"] == 3 and detail["alreadyAcknowledged"] == 2
    assert detail["filter"] == {**done.json()["filter"], "destination": CHAT,
                                "status": "failed", "channel": None}

    drained = client.post("/api/admin/delivery/drain", headers=ops()).json()
    assert drained["recovered"] == 3
    assert Counter(m["text"] for m in telegram.messages) == {"m0": 1, "m1": 1, "m2": 1}


@pytest.mark.parametrize(("change", "field"), [
    ({"since": "2026-12-01T10:00:00"}, "since"),
    ({"since": "yesterday"}, "since"),
    ({"until": "2000-01-01T00:00:00Z"}, "until"),
    ({"until": "2999-01-01T00:00:00Z"}, "until"),
    ({"status": "pending"}, "status"),
    ({"channel": "fax"}, "channel"),
    ({"channel": "slack"}, "channel"),  # no Slack credential: its destinations are unknown
    ({"destination": ""}, "destination"),
    ({"limit": 100}, "limit"),
    ({"dryRun": "yes"}, "dryRun"),
])
def test_over_http_what_cannot_be_honoured_is_a_400_naming_the_field(
        client: TestClient, svc: Services, change: dict[str, Any], field: str) -> None:
    failed_and_acked(svc, 1, 0)
    answer = client.post(URL, json={"destination": CHAT, "since": since(), **change},
                         headers=ops())
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == field
    assert DeliveryStore(svc.db).list(status=DeliveryStatus.PENDING) == []
    assert [r["outcome"] for r in replay_rows(svc)] == ["400"], "refused, and audited so"


def test_over_http_roles(client: TestClient) -> None:
    body = {"destination": CHAT, "since": since()}
    assert client.post(URL, json=body).status_code == 401
    billing = {"authorization": f"Bearer {admin_token(['billing'], subject='bill-1')}"}
    assert client.post(URL, json=body, headers=billing).status_code == 403
    assert client.post(URL, params={"dryRun": "true"}, json=body,
                       headers=ops()).status_code == 400, "the dry run is a body field"


def test_the_command_line(env: dict[str, str], svc: Services,
                          telegram: TelegramStandIn) -> None:
    failed_and_acked(svc, 2, 1)
    base = ["delivery", "replay", "--destination", CHAT, "--since", since()]

    naive = run_cli(["delivery", "replay", "--destination", CHAT, "--since",
                     "2026-12-01T10:00:00"], env)
    assert naive.returncode == 64 and "since must be an ISO 8601 time" in naive.stderr
    backwards = run_cli([*base, "--until", "2000-01-01T00:00:00Z"], env)
    assert backwards.returncode == 64 and "until must be later than since" in backwards.stderr
    assert run_cli([*base, "--status", "pending"], env).returncode == 64
    lone = run_cli([*base, "--dry-run", "--by", "oncall"], env)
    assert lone.returncode == 64 and "a dry run writes none" in lone.stderr

    dry = run_cli([*base, "--dry-run", "--json"], env)
    assert dry.returncode == 0, dry.stderr
    assert (json.loads(dry.stdout)["count"], json.loads(dry.stdout)["alreadyAcknowledged"]) == (
        2, 1)
    human = run_cli([*base, "--dry-run"], env)
    assert f"would replay 2 failed entries of {CHAT}" in human.stdout
    assert "already acknowledged by the receiver: 1" in human.stdout
    assert replay_rows(svc) == []

    done = run_cli([*base, "--by", "oncall", "--json"], env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["count"] == 2
    [row] = replay_rows(svc)
    assert (row["actor"], row["target"], row["outcome"]) == ("oncall", CHAT, "replayed=2")
    assert detail_of(row)["count"] == 2 and detail_of(row)["filter"]["destination"] == CHAT

    drained = run_cli(["run", "delivery-drain", "--json"], env)
    assert drained.returncode == 0 and json.loads(drained.stdout)["recovered"] == 2
    assert Counter(m["text"] for m in telegram.messages) == {"m0": 1, "m1": 1}


MANY = 1200  # three pages of a replay (BATCH: 500 entries a page)

# The HTTP function serving one event read from stdin, in a process of its own, so that a
# crash point kills it for real (no middleware settles its audit row).
HTTP_FUNCTION = """
import json, sys
from functions import http
from tests.lambda_context import LambdaContext
answer = http.handler(json.load(sys.stdin), LambdaContext())
print(json.dumps(answer))
"""


def replay_event(body: dict[str, Any]) -> dict[str, Any]:
    """The replay's POST as the HTTP function receives it (payload format 2.0)."""
    event = load_event("http_post_admin")
    event.pop("cookies")
    event["rawPath"] = event["requestContext"]["http"]["path"] = URL
    event["headers"] = {**event["headers"], **ops(), "content-type": "application/json"}
    event["body"] = json.dumps(body)
    return event


def answer_of(answer: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    raw = answer["body"]
    text = base64.b64decode(raw).decode() if answer.get("isBase64Encoded") else raw
    return answer["statusCode"], json.loads(text)


def pending(svc: Services) -> int:
    with svc.db.transaction() as tx:
        row = tx.fetchone("SELECT count(*) AS n FROM delivery_queue WHERE status = 'pending'")
    assert row is not None
    return int(row["n"])


@pytest.mark.parametrize("via", ["cli", "http"])
def test_a_replay_killed_part_way_leaves_its_audit_row_holding_its_count(
        via: str, env: dict[str, str], svc: Services) -> None:
    # GIVEN 1,200 failed entries of one chat, among 300 of another
    insert_failed(svc.db, [("telegram", "1001")] * MANY + [("telegram", "1003")] * 300)
    crash = {**env, "SLUICE_CRASH_AT": "replay.after_page@2"}
    body = {"destination": CHAT, "since": since()}
    # WHEN a replay is killed for real after its second page
    if via == "cli":
        killed = run_cli(["delivery", "replay", "--destination", CHAT, "--since",
                          body["since"], "--by", "oncall", "--json"], crash)
    else:
        killed = subprocess.run([sys.executable, "-c", HTTP_FUNCTION], env=process_env(crash),
                                input=json.dumps(replay_event(body)), capture_output=True,
                                text=True, timeout=120, check=False, cwd=ROOT)
    assert killed.returncode == CRASH_EXIT_CODE, killed.stderr
    # THEN its audit row, never settled, holds its filter, the count it restarted (as the
    # queue has it) and where to continue
    [row] = replay_rows(svc)
    detail = detail_of(row)
    assert row["outcome"] == "started"
    assert detail["filter"]["destination"] == CHAT
    assert detail["count"] == pending(svc) == 1000 and detail["pages"] == 2
    assert detail["next"]["after"] is not None
    # AND the rest, asked for from there, is the 200 it had not reached
    rest = run_cli(["delivery", "replay", "--destination", CHAT, "--since",
                    detail["next"]["since"], "--until", detail["next"]["until"], "--after",
                    detail["next"]["after"], "--json"], env)
    assert rest.returncode == 0, rest.stderr
    assert json.loads(rest.stdout)["count"] == MANY - 1000
    assert pending(svc) == MANY, "each entry of the chat restarted once, the other's none"


def test_over_http_a_replay_stops_before_the_deadline_and_its_next_completes_it(
        env: dict[str, str], svc: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    insert_failed(svc.db, [("telegram", "1001")] * MANY)
    http = fresh_import("functions.http", monkeypatch, env)
    margin_ms = int(http.app.state.services.settings.deadline_margin_s * 1000)
    # WHEN the replay is asked of a function whose time is all margin (it does one page)
    status, first = answer_of(http.handler(replay_event({"destination": CHAT,
                                                         "since": since()}),
                                           LambdaContext(timeout_ms=margin_ms)))
    # THEN it answers what it did and the body to send for the rest
    assert status == 200, first
    assert (first["count"], first["pages"]) == (500, 1) and pending(svc) == 500
    assert first["next"]["destination"] == CHAT and first["next"]["after"]
    # WHEN that body is sent again, with the function's whole time
    status, rest = answer_of(http.handler(replay_event(first["next"]), LambdaContext()))
    # THEN the rest of the window is done, and nothing is left to continue
    assert status == 200, rest
    assert (rest["count"], rest["next"]) == (MANY - 500, None)
    assert pending(svc) == MANY
    # AND each call is one audit row with its own filter and count
    assert sorted((row["outcome"], detail_of(row)["count"], detail_of(row)["filter"]["after"])
                  for row in replay_rows(svc)) == [("200", 500, None),
                                                   ("200", MANY - 500, first["next"]["after"])]
    http.app.state.services.close()
