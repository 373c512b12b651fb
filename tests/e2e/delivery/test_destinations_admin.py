"""The destinations over HTTP and the command line, on both backends: the view, the entries'
destination and its filter, a change previewed (nothing written) then confirmed (one audit
row: who, what, until when), the refusals (a field not taken, a time past or too far, a
change that would do nothing), and roles."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.core.times import iso_z
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.http.app import create_app
from sluice.jobs.runs import RunStore
from sluice.store.db import utcnow
from tests.conftest import BASE_ENV, CRON_SECRET, admin_token, run_cli
from tests.providers.telegram import TelegramStandIn

BASE = "/api/admin/delivery"
CHAT = "telegram:1001"


def ops() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['ops'], subject='ops-1')}"}


@pytest.fixture
def telegram() -> Iterator[TelegramStandIn]:
    with TelegramStandIn(chats=("1001", "1003"), blocked=("1002",)) as stand_in:
        yield stand_in


@pytest.fixture
def env(db_url: str, telegram: TelegramStandIn) -> dict[str, str]:
    # a chat takes 50 a second here: what is released goes out in one drain
    return {**BASE_ENV, "SLUICE_DATABASE_URL": db_url,
            "SLUICE_TELEGRAM_BOT_TOKEN": telegram.token,
            "SLUICE_TELEGRAM_API_URL": telegram.url,
            "SLUICE_TELEGRAM_CHAT_RATE_PER_SECOND": "50"}


@pytest.fixture
def svc(env: dict[str, str], make_services: Callable[..., Services]) -> Services:
    return make_services(env["SLUICE_DATABASE_URL"],
                         **{k: v for k, v in env.items() if k.startswith("SLUICE_TELEGRAM")})


@pytest.fixture
def client(svc: Services) -> TestClient:
    return TestClient(create_app(svc), raise_server_exceptions=False)


def drain(client: TestClient) -> dict[str, object]:
    answer = client.get(f"{BASE}/drain", headers={"authorization": f"Bearer {CRON_SECRET}"})
    assert answer.status_code == 200, answer.text
    body: dict[str, object] = answer.json()
    return body


def audit_rows(svc: Services) -> list[dict[str, object]]:
    return [row for row in RunStore(svc.db).recent_audit()
            if str(row["action"]).startswith("delivery:destination_")]


def test_the_view_shows_each_destination_its_state_waiting_errors_and_rates(
        client: TestClient, svc: Services) -> None:
    store = DeliveryStore(svc.db)
    assert client.get(f"{BASE}/destinations", headers=ops()).json() == {
        "destinations": [], "count": 0, "next": None}
    store.enqueue("telegram", "1001", {"text": "ok"})
    store.enqueue("telegram", "-100200", {"text": "a group nobody knows"})
    store.enqueue("telegram", "1002", {"text": "blocked"})
    drain(client)

    found = {d["key"]: d for d in client.get(f"{BASE}/destinations", headers=ops()).json()[
        "destinations"]}
    assert {k: d["state"] for k, d in found.items()} == {
        CHAT: "ok", "telegram:-100200": "disabled", "telegram:1002": "disabled"}
    ok = found[CHAT]
    assert ok["lastSuccess"] is not None and ok["waiting"] == 0 and ok["disabled"] is None
    assert [(r["key"], r["limit"], r["per"], r["source"]) for r in ok["rates"]] == [
        ("telegram:bot", 30.0, "second", "SLUICE_TELEGRAM_RATE_PER_SECOND"),
        ("telegram:chat:1001", 50.0, "second", "SLUICE_TELEGRAM_CHAT_RATE_PER_SECOND")]
    group = found["telegram:-100200"]
    assert group["rates"][1]["per"] == "minute", "a group's rate is per minute"
    blocked = found["telegram:1002"]
    assert blocked["since"] == blocked["disabled"]["since"]
    assert "bot was blocked" in blocked["disabled"]["reason"] and blocked["failed"] == 1
    only = client.get(f"{BASE}/destinations", params={"state": "disabled"}, headers=ops())
    assert only.json()["count"] == 2
    assert client.get(f"{BASE}/destinations", params={"state": "sad"},
                      headers=ops()).status_code == 400
    one = client.get(f"{BASE}/destinations/{CHAT}", headers=ops()).json()
    assert one == ok

    # the entries carry their destination, and the list filters on it
    listed = client.get(f"{BASE}/entries", params={"destination": "telegram:1002"},
                        headers=ops()).json()["entries"]
    assert [(e["recipient"], e["destination"]) for e in listed] == [("1002", "telegram:1002")]


def test_a_pause_is_previewed_then_confirmed_and_audited_once_with_until(
        client: TestClient, svc: Services, telegram: TelegramStandIn) -> None:
    store = DeliveryStore(svc.db)
    store.enqueue("telegram", "1001", {"text": "first"})
    drain(client)  # the chat is known: its entries carry its key
    waiting = [store.enqueue("telegram", "1001", {"text": f"n{n}"})[0] for n in range(3)]
    until = iso_z(utcnow() + timedelta(hours=1))

    # WHEN the console asks what a pause would do
    asked = client.post(f"{BASE}/destinations/{CHAT}/pause",
                        json={"until": until, "reason": "receiver maintenance",
                              "dryRun": True}, headers=ops())

    # THEN it answers, and nothing changed, nothing was audited
    assert asked.status_code == 200, asked.text
    preview = asked.json()
    assert preview["dryRun"] is True and preview["entries"]["pending"] == 3
    assert preview["current"]["state"] == "ok" and "wait until" in preview["effect"]
    assert audit_rows(svc) == []
    assert {store.get(e.id).held_by for e in waiting} == {None}

    # WHEN it confirms
    done = client.post(f"{BASE}/destinations/{CHAT}/pause",
                       json={"until": until, "reason": "receiver maintenance"}, headers=ops())

    # THEN the entries wait, the destination is paused until then, and one audit row says
    # who, what and until when
    assert done.status_code == 200, done.text
    assert done.json()["moved"] == 3 and done.json()["current"]["state"] == "paused"
    assert done.json()["current"]["until"] == until
    [row] = audit_rows(svc)
    assert (row["actor"], row["action"], row["outcome"]) == (
        "ops-1", "delivery:destination_pause", "200")
    detail = row["detail"] if isinstance(row["detail"], dict) else json.loads(str(row["detail"]))
    assert detail["change"] == {"action": "pause", "destination": CHAT, "until": until,
                                "reason": "receiver maintenance", "rate": None,
                                "clear": False}
    assert drain(client)["recovered"] == 0
    assert len(telegram.messages) == 1

    # AND a resume sends them, once
    assert client.post(f"{BASE}/destinations/{CHAT}/resume", headers=ops()).status_code == 200
    assert drain(client)["recovered"] == 3
    assert [m["text"] for m in telegram.messages] == ["first", "n0", "n1", "n2"]


def test_changes_are_parsed_strictly_and_a_change_that_does_nothing_is_refused(
        client: TestClient, svc: Services) -> None:
    def post(action: str, body: object, key: str = CHAT) -> tuple[int, str | None]:
        answer = client.post(f"{BASE}/destinations/{key}/{action}", json=body, headers=ops())
        return answer.status_code, answer.json()["error"].get("field") if answer.status_code >= 400 else None

    hour = iso_z(utcnow() + timedelta(hours=1))
    assert post("pause", {}) == (400, "until")
    assert post("pause", {"until": hour, "limit": 3}) == (400, "limit")
    assert post("pause", {"until": iso_z(utcnow() - timedelta(minutes=1))}) == (400, "until")
    assert post("pause", {"until": iso_z(utcnow() + timedelta(days=31))}) == (400, "until")
    assert post("pause", {"until": "2026-12-01T10:00:00"}) == (400, "until"), "no offset"
    assert post("pause", {"until": hour, "dryRun": "yes"}) == (400, "dryRun")
    assert post("rate", {"limit": 5, "per": "hour", "until": hour}) == (400, "per")
    assert post("rate", {"limit": 0, "per": "second", "until": hour}) == (400, "limit")
    assert post("rate", {"limit": True, "per": "second", "until": hour}) == (400, "limit")
    assert post("rate", {"limit": 5, "per": "second"}) == (400, "until")
    assert post("rate", {"clear": True, "limit": 5}) == (400, "clear")
    assert post("resume", {}) == (409, None)
    assert post("enable", {}) == (409, None)
    assert post("rate", {"clear": True}) == (409, None)
    assert post("disable", {"reason": "x" * 201}) == (400, "reason")
    assert client.post(f"{BASE}/destinations/{CHAT}/explode", json={},
                       headers=ops()).status_code in (404, 405)
    assert client.post(f"{BASE}/destinations/{CHAT}/pause", json={"until": hour},
                       params={"force": "true"}, headers=ops()).status_code == 400
    assert client.get(f"{BASE}/destinations").status_code == 401
    billing = {"authorization": f"Bearer {admin_token(['billing'], subject='bill-1')}"}
    assert client.post(f"{BASE}/destinations/{CHAT}/disable", json={},
                       headers=billing).status_code == 403
    assert client.get(f"{BASE}/destinations/{CHAT}", headers=ops()).json()["state"] == "ok"


def test_a_rate_override_and_a_disable_from_the_api(client: TestClient, svc: Services,
                                                   telegram: TelegramStandIn) -> None:
    until = iso_z(utcnow() + timedelta(hours=1))
    rated = client.post(f"{BASE}/destinations/{CHAT}/rate",
                        json={"limit": 6, "per": "minute", "until": until}, headers=ops())
    assert rated.status_code == 200, rated.text
    current = rated.json()["current"]
    assert current["rateOverride"] == {"limit": 6.0, "per": "minute", "until": until}
    assert current["rates"][-1] == {"key": "telegram:chat:1001", "limit": 6.0,
                                    "per": "minute", "source": "override", "until": until}
    cleared = client.post(f"{BASE}/destinations/{CHAT}/rate", json={"clear": True},
                          headers=ops())
    assert cleared.json()["current"]["rateOverride"] is None

    store = DeliveryStore(svc.db)
    store.enqueue("telegram", "1001", {"text": "known"})
    drain(client)
    entry, _ = store.enqueue("telegram", "1001", {"text": "waits"})
    disabled = client.post(f"{BASE}/destinations/{CHAT}/disable",
                           json={"reason": "the chat moved"}, headers=ops())
    assert disabled.json()["moved"] == 1, "for a recipient it knows: failed at once"
    failed = store.get(entry.id)
    assert (failed.failure_reason, failed.attempts) == ("destination_disabled", 0)
    assert "the chat moved" in (failed.last_error or "")
    assert drain(client)["failedDisabled"] == 0
    assert len(telegram.messages) == 1
    assert client.post(f"{BASE}/destinations/{CHAT}/disable", json={},
                       headers=ops()).status_code == 409
    enabled = client.post(f"{BASE}/destinations/{CHAT}/enable", headers=ops())
    assert enabled.json()["current"]["state"] == "ok"
    redriven = client.post(f"{BASE}/redrive", params={"destination": CHAT}, headers=ops())
    assert redriven.json() == {"redriven": 1}
    assert drain(client)["recovered"] == 1
    assert store.get(entry.id).status is DeliveryStatus.ACKED
    actions = [row["action"] for row in audit_rows(svc)]
    assert sorted(actions) == sorted(["delivery:destination_rate"] * 2 + [
        "delivery:destination_disable"] * 2 + ["delivery:destination_enable"])


def test_the_command_line(env: dict[str, str], svc: Services,
                          telegram: TelegramStandIn) -> None:
    sent = run_cli(["delivery", "enqueue", "telegram", "1001", "--text", "hi", "--send",
                    "--json"], env)
    assert sent.returncode == 0, sent.stderr
    listed = json.loads(run_cli(["delivery", "destinations", "--json"], env).stdout)
    assert [(d["key"], d["state"]) for d in listed["destinations"]] == [(CHAT, "ok")]
    human = run_cli(["delivery", "destinations"], env)
    assert human.returncode == 0 and CHAT in human.stdout and "rates=30/second" in human.stdout

    until = iso_z(utcnow() + timedelta(hours=2))
    preview = run_cli(["delivery", "destination", "pause", CHAT, "--until", until,
                       "--dry-run", "--json"], env)
    assert preview.returncode == 0, preview.stderr
    assert json.loads(preview.stdout)["dryRun"] is True and audit_rows(svc) == []
    assert run_cli(["delivery", "destination", "pause", CHAT, "--until", until, "--dry-run",
                    "--by", "alice"], env).returncode == 64
    paused = run_cli(["delivery", "destination", "pause", CHAT, "--until", until,
                      "--by", "alice", "--json"], env)
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout)["current"]["state"] == "paused"
    [row] = audit_rows(svc)
    assert (row["actor"], row["action"], row["target"]) == (
        "alice", "delivery:destination_pause", f"/api/admin/delivery/destinations/{CHAT}")
    detail = row["detail"] if isinstance(row["detail"], dict) else json.loads(str(row["detail"]))
    assert detail["change"]["until"] == until

    enqueued = run_cli(["delivery", "enqueue", "telegram", "1001", "--text", "later", "--send",
                        "--json"], env)
    assert json.loads(enqueued.stdout)["status"] == "pending", "the inline path waits too"
    assert [m["text"] for m in telegram.messages] == ["hi"]
    listed = json.loads(run_cli(["delivery", "list", "--destination", CHAT, "--json"],
                                env).stdout)
    assert [e["destination"] for e in listed] == [CHAT, CHAT]
    assert run_cli(["delivery", "destination", "rate", CHAT, "--limit", "5", "--per", "hour",
                    "--until", until], env).returncode == 64
    assert run_cli(["delivery", "destination", "resume", CHAT, "--by", "alice"],
                   env).returncode == 0
    assert run_cli(["delivery", "destination", "resume", CHAT], env).returncode == 64
    assert run_cli(["run", "delivery-drain", "--json"], env).returncode == 0
    assert [m["text"] for m in telegram.messages] == ["hi", "later"]


def test_the_view_pages_by_key_and_refuses_what_it_cannot_honour(
        client: TestClient, svc: Services, env: dict[str, str]) -> None:
    # GIVEN 12 chats with entries, and 3 of them paused by an operator
    store = DeliveryStore(svc.db)
    chats = [f"telegram:{2000 + i}" for i in range(12)]
    for key in chats:
        store.enqueue("telegram", key.split(":")[1], {"text": "hi"})
    until = iso_z(utcnow() + timedelta(hours=1))
    for key in chats[1::4]:
        assert client.post(f"{BASE}/destinations/{key}/pause", json={"until": until},
                           headers=ops()).status_code == 200

    def pages(**params: str) -> list[list[str]]:
        found, after = [], None
        for _ in range(len(chats) + 1):  # a page holds at least one, or is the last
            answer = client.get(f"{BASE}/destinations", headers=ops(),
                                params={**params, **({"after": after} if after else {})})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["count"] == len(body["destinations"])
            found.append([d["key"] for d in body["destinations"]])
            after = body["next"]
            if after is None:
                return found
        raise AssertionError(f"the pages never end: {found}")

    # WHEN the view is read 5 at a time, THEN every chat comes once, in key order
    assert pages(limit="5") == [chats[:5], chats[5:10], chats[10:]]
    # AND a state's pages hold only that state's
    assert [k for page in pages(state="paused", limit="2") for k in page] == chats[1::4]
    assert [k for page in pages(state="ok", limit="4") for k in page] == [
        k for k in chats if k not in chats[1::4]]
    # AND the command line pages the same way
    first = run_cli(["delivery", "destinations", "--limit", "5", "--json"], env)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["next"] == chats[4]
    rest = run_cli(["delivery", "destinations", "--after", chats[4], "--limit", "100"], env)
    assert rest.returncode == 0 and chats[5] in rest.stdout and chats[4] not in rest.stdout
    assert "--after" in run_cli(["delivery", "destinations", "--limit", "5"], env).stdout
    bad = run_cli(["delivery", "destinations", "--limit", "0"], env)
    assert bad.returncode == 64 and "limit must be a whole number" in bad.stderr

    # AND what a page cannot honour is a 400 naming it
    for params, field in (({"limit": "0"}, "limit"), ({"limit": "1001"}, "limit"),
                          ({"limit": "ten"}, "limit"), ({"after": "x" * 2101}, "after"),
                          ({"state": "sad"}, "state")):
        answer = client.get(f"{BASE}/destinations", params=params, headers=ops())
        assert answer.status_code == 400, (params, answer.text)
        assert answer.json()["error"]["field"] == field
    assert client.get(f"{BASE}/destinations", params={"page": "2"},
                      headers=ops()).status_code == 400
