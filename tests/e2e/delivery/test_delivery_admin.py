"""The delivery queue's admin surface over HTTP and the command line, on both backends:
roles, list/show/redrive/purge, audit, typed 4xx, and the drain's cron route."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.http.app import create_app
from sluice.jobs.runs import RunStore
from tests.conftest import BASE_ENV, CRON_SECRET, admin_token, run_cli
from tests.providers.telegram import TelegramStandIn

BASE = "/api/admin/delivery"


def ops() -> dict[str, str]:
    """Minted per request: a token minted at import expires on a slow run."""
    return {"authorization": f"Bearer {admin_token(['ops'], subject='ops-1')}"}


def billing() -> dict[str, str]:
    """Minted per request: a token minted at import expires on a slow run."""
    return {"authorization": f"Bearer {admin_token(['billing'], subject='bill-1')}"}


@pytest.fixture
def telegram() -> Iterator[TelegramStandIn]:
    with TelegramStandIn(chats=("1001",), blocked=("1002",)) as stand_in:
        yield stand_in


@pytest.fixture
def env(db_url: str, telegram: TelegramStandIn) -> dict[str, str]:
    return {**BASE_ENV, "SLUICE_DATABASE_URL": db_url,
            "SLUICE_TELEGRAM_BOT_TOKEN": telegram.token,
            "SLUICE_TELEGRAM_API_URL": telegram.url}


@pytest.fixture
def svc(env: dict[str, str], make_services: Callable[..., Services]) -> Services:
    return make_services(env["SLUICE_DATABASE_URL"],
                         **{k: v for k, v in env.items() if k.startswith("SLUICE_TELEGRAM")})


@pytest.fixture
def client(svc: Services) -> TestClient:
    return TestClient(create_app(svc), raise_server_exceptions=False)


def test_failed_entries_over_http_list_show_redrive_purge(
        client: TestClient, svc: Services, telegram: TelegramStandIn) -> None:
    store = DeliveryStore(svc.db)
    blocked, _ = store.enqueue("telegram", "1002", {"text": "a"})
    gone, _ = store.enqueue("telegram", "404", {"text": "b"})
    store.enqueue("telegram", "1001", {"text": "c"})
    cron = client.get(f"{BASE}/drain", headers={"authorization": f"Bearer {CRON_SECRET}"})
    assert cron.status_code == 200
    counts = {k: cron.json()[k] for k in ("recovered", "failed", "skippedMaxRetries",
                                          "deferredBackoff", "failedDisabled")}
    # a chat that blocked the bot, and one not found: each refusal disables its chat
    assert counts == {"recovered": 1, "failed": 0, "skippedMaxRetries": 0, "deferredBackoff": 0,
                      "failedDisabled": 2}
    assert sorted(cron.json()["disabled"]) == ["telegram:1002", "telegram:404"]

    listed = client.get(f"{BASE}/entries", params={"status": "failed"}, headers=ops())
    assert listed.status_code == 200
    assert {e["id"] for e in listed.json()["entries"]} == {blocked.id, gone.id}
    shown = client.get(f"{BASE}/entries/{blocked.id}", headers=ops()).json()
    assert shown["status"] == "failed" and "bot was blocked" in shown["lastError"]
    stats = client.get(f"{BASE}/stats", headers=ops()).json()["statuses"]
    assert (stats["failed"]["count"], stats["acked"]["count"]) == (2, 1)

    # The user unblocked the bot: enable the chat, redrive, and the next drain delivers.
    telegram.blocked.clear()
    telegram.chats.add("1002")
    enabled = client.post(f"{BASE}/destinations/telegram:1002/enable", headers=ops())
    assert enabled.status_code == 200, enabled.text
    redriven = client.post(f"{BASE}/entries/{blocked.id}/redrive", headers=ops())
    assert redriven.status_code == 200
    assert (redriven.json()["status"], redriven.json()["attempts"]) == ("pending", 0)
    again = client.post(f"{BASE}/entries/{blocked.id}/redrive", headers=ops())
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    assert client.post(f"{BASE}/drain", headers=ops()).json()["recovered"] == 1
    assert store.get(blocked.id).status is DeliveryStatus.ACKED

    assert client.post(f"{BASE}/entries/{gone.id}/purge", headers=ops()).json() == {
        "purged": 1, "id": gone.id}
    assert client.get(f"{BASE}/entries/{gone.id}", headers=ops()).status_code == 404
    assert client.post(f"{BASE}/purge", headers=ops()).json() == {"purged": 0}
    assert client.post(f"{BASE}/redrive", headers=ops()).json() == {"redriven": 0}

    audit = [(a["actor"], a["action"], a["outcome"]) for a in RunStore(svc.db).recent_audit()]
    assert ("ops-1", "delivery:redrive", "200") in audit
    assert ("ops-1", "delivery:redrive", "409") in audit
    assert ("ops-1", "delivery:purge", "200") in audit


def test_roles_and_bad_input(client: TestClient, svc: Services) -> None:
    assert client.get(f"{BASE}/entries").status_code == 401
    assert client.get(f"{BASE}/entries", headers=billing()).status_code == 403
    assert client.post(f"{BASE}/redrive", headers=billing()).status_code == 403
    bad = client.get(f"{BASE}/entries", params={"status": "lost"}, headers=ops())
    assert bad.status_code == 400 and "status must be one of" in bad.json()["error"]["message"]
    assert client.get(f"{BASE}/entries", params={"limit": 0}, headers=ops()).status_code == 400
    assert client.post(f"{BASE}/entries/nope/redrive", headers=ops()).status_code == 404
    audit = {(a["actor"], a["outcome"]) for a in RunStore(svc.db).recent_audit()}
    assert ("bill-1", "403") in audit, "a refused admin action is audited too"


def test_the_command_line(env: dict[str, str], svc: Services,
                          telegram: TelegramStandIn) -> None:
    sent = run_cli(["delivery", "enqueue", "telegram", "1001", "--text", "hi", "--send",
                    "--json", "--user", "u1"], env)
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["status"] == "acked" and telegram.messages[0]["text"] == "hi"

    refused = run_cli(["delivery", "enqueue", "telegram", "1002", "--text", "x", "--send",
                       "--json"], env)
    assert refused.returncode == 2, "a permanent failure on the inline path exits 2"
    entry = json.loads(refused.stdout)
    assert entry["status"] == "failed" and "bot was blocked" in entry["lastError"]

    listed = json.loads(run_cli(["delivery", "list", "--status", "failed", "--json"], env).stdout)
    assert [e["id"] for e in listed] == [entry["id"]]
    human = run_cli(["delivery", "show", entry["id"]], env)
    assert human.returncode == 0 and "bot was blocked by the user" in human.stdout
    assert "failed_at=" in human.stdout

    redriven = run_cli(["delivery", "redrive", entry["id"], "--by", "oncall", "--json"], env)
    assert json.loads(redriven.stdout)["status"] == "pending"
    assert entry["destination"] == "telegram:1002"
    conflict = run_cli(["delivery", "purge", entry["id"]], env)
    assert conflict.returncode == 64 and "only a failed or unknown entry can be purged" in conflict.stderr
    assert run_cli(["delivery", "redrive"], env).returncode == 64
    assert run_cli(["delivery", "enqueue", "telegram", "1", "--payload", "[1]"],
                   env).returncode == 64

    # the chat is disabled (it blocked the bot): the redriven entry fails at once, unsent,
    # apart from the run's failures (the disable paged when it happened)
    drained = run_cli(["run", "delivery-drain", "--json"], env)
    assert drained.returncode == 0 and json.loads(drained.stdout)["failedDisabled"] == 1
    purged = run_cli(["delivery", "purge", "--all-failed", "--by", "oncall", "--json"], env)
    assert json.loads(purged.stdout) == {"purged": 1}
    stats = json.loads(run_cli(["delivery", "stats", "--json"], env).stdout)["statuses"]
    assert (stats["acked"]["count"], stats["failed"]["count"]) == (1, 0)
    actions = {(a["actor"], a["action"]) for a in RunStore(svc.db).recent_audit()}
    assert {("oncall", "delivery:redrive"), ("oncall", "delivery:purge_all")} <= actions


def test_queue_status_for_monitoring(client: TestClient, svc: Services,
                                     telegram: TelegramStandIn) -> None:
    store = DeliveryStore(svc.db)
    cron = {"authorization": f"Bearer {CRON_SECRET}"}
    empty = client.get("/api/queue/status", headers=cron)
    assert empty.status_code == 200
    assert empty.json() == {"depth": {"pending": 0, "in_flight": 0, "acked": 0, "failed": 0,
                                      "unknown": 0},
                            "inBackoff": 0, "oldestPendingAgeS": None, "destinations": [],
                            "lastSummary": None}

    # a failed entry, then a flood wait longer than the in-process retries wait: the chat is
    # slowed for every sender and the entry set aside until then, no attempt counted
    store.enqueue("telegram", "1002", {"text": "blocked"})
    client.get(f"{BASE}/drain", headers=cron)
    telegram.flood_wait.append(60)
    later, _ = store.enqueue("telegram", "1001", {"text": "later"})
    drained = client.get(f"{BASE}/drain", headers=cron).json()
    # set aside at least for Telegram's wait (and once before for the bot's next slot, when
    # the run came within its spacing of the first one's send: each set-aside counts)
    assert drained["rateLimited"] >= 1
    waiting = store.get(later.id)
    assert waiting.attempts == 0 and "retry after 60" in (waiting.last_error or "")
    store.enqueue("telegram", "1001", {"text": "not yet drained"})

    status = client.get("/api/queue/status", headers=ops())

    assert status.status_code == 200
    body = status.json()
    assert body["depth"] == {"pending": 2, "in_flight": 0, "acked": 0, "failed": 1,
                             "unknown": 0}
    assert body["inBackoff"] == 1
    assert body["destinations"] == [], "a rate limit is not a failing destination"
    assert body["oldestPendingAgeS"] >= 0
    assert body["lastSummary"]["outcome"] == "ok"
    assert body["lastSummary"]["summary"] == drained
    assert body["lastSummary"]["finishedAt"].endswith("Z")


def test_queue_status_refuses_strangers_and_unknown_parameters(client: TestClient) -> None:
    assert client.get("/api/queue/status").status_code == 401
    assert client.get("/api/queue/status", headers=billing()).status_code == 403
    wrong = client.get("/api/queue/status", headers={"authorization": "Bearer not-the-secret"})
    assert wrong.status_code == 401
    bad = client.get("/api/queue/status", params={"verbose": "true"},
                     headers={"authorization": f"Bearer {CRON_SECRET}"})
    assert bad.status_code == 400 and "verbose" in bad.json()["error"]["message"]


def test_enqueue_refuses_unknown_channels_and_unsupported_fields(env: dict[str, str]) -> None:
    unknown = run_cli(["delivery", "enqueue", "sms", "+46", "--text", "x"], env)
    assert unknown.returncode == 64 and "invalid choice: 'sms'" in unknown.stderr
    field = run_cli(["delivery", "enqueue", "telegram", "1001", "--payload",
                     '{"text": "x", "parseMode": "MarkdownV2"}'], env)
    assert field.returncode == 64
    assert "payload.parseMode is not supported by the telegram channel" in field.stderr
    parts = run_cli(["delivery", "enqueue", "telegram", "1001", "--json", "--payload",
                     '{"payloads": ["one", {"text": "two"}], "threadId": "7", "silent": true}'],
                    env)
    assert parts.returncode == 0, parts.stderr
    assert json.loads(parts.stdout)["payload"]["payloads"] == ["one", {"text": "two"}]
