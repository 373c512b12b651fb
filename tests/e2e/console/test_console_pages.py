"""The console's pages over HTTP: who gets in (and why not), CSRF, strict parameters, the
JSON twins' numbers, failing sources, and actions that are audited."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.cli.dev import startup_summary
from sluice.core.services import Services
from sluice.http.app import create_app
from sluice.jobs.runs import RunStore
from sluice.queues.deadletters import LocalDeadLetters
from sluice.queues.signing import Signer
from sluice.store.flags import FlagStore
from tests.conftest import admin_token

SIGNING = "signing-secret-0123456789"


def _client(services: Services, roles: list[str] | None = None, **kwargs: Any) -> TestClient:
    client = TestClient(create_app(services), **kwargs)
    if roles is not None:
        client.cookies.set("__session", admin_token(roles))
    return client


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert match, "the page carries a CSRF token"
    return match.group(1)


def _dead(services: Services, n: int) -> list[str]:
    message = {"topic": "rss.ingest", "batchId": "b1", "sourceId": "s1",
               "feedUrl": "https://feeds.example/a.xml", "publishedAt": "2026-01-01T00:00:00Z"}
    message = Signer([SIGNING]).sign(message)
    return [LocalDeadLetters(services.db).add("rss.ingest", {
        "originalMessageId": f"m{i}", "originalTopic": "rss.ingest", "deliveryCount": 5,
        "failedAt": f"2026-11-30T10:00:0{i}.000Z", "errorMessage": f"boom {i}",
        "originalMessage": message}) for i in range(n)]


@pytest.mark.parametrize("cookie, status, reason", [
    (None, 401, "missing"),
    ("expired", 401, "expired"),
    ("billing", 403, "role"),
])
def test_the_restricted_page_says_why(sqlite_url: str, make_services: Any, cookie: str | None,
                                      status: int, reason: str) -> None:
    client = _client(make_services(sqlite_url))
    if cookie == "expired":
        client.cookies.set("__session", admin_token(["ops"], expires_in=-60))
    elif cookie:
        client.cookies.set("__session", admin_token([cookie]))
    page = client.get("/admin/queues")
    assert page.status_code == status
    assert "Queue monitoring access is restricted" in page.text
    assert "This operations surface is limited to platform users with queue monitoring access." \
        in page.text
    assert f'data-reason="{reason}"' in page.text
    twin = client.get("/api/admin/console/overview")
    assert twin.status_code == status and twin.json()["error"]["reason"] == reason


def test_flags_are_for_super_admins_only(sqlite_url: str, make_services: Any) -> None:
    services = make_services(sqlite_url)
    assert _client(services, ["ops"]).get("/admin/flags").status_code == 403
    page = _client(services, ["super_admin"]).get("/admin/flags")
    assert page.status_code == 200 and "RSS queue pipeline" in page.text


def test_pages_carry_a_strict_csp_and_their_assets_are_local(sqlite_url: str,
                                                             make_services: Any) -> None:
    client = _client(make_services(sqlite_url), ["ops"])
    page = client.get("/admin/queues")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp
    assets = re.findall(r'(?:href|src)="([^"#?]+\.(?:css|js))"', page.text)
    assert sorted(assets) == ["/admin/static/console.css", "/admin/static/console.js"]
    for asset in assets:
        assert client.get(asset).status_code == 200
    assert "http://" not in page.text and "https://" not in page.text
    assert client.get("/admin/static/../pages.py").status_code == 404


def test_the_overview_twin_has_the_pages_numbers(db_url: str, make_services: Any) -> None:
    services = make_services(db_url)
    _dead(services, 3)
    client = _client(services, ["ops"])
    data = client.get("/api/admin/console/overview").json()
    cards = {c["key"]: c for c in data["cards"]}
    assert cards["rss.ingest-dlq"]["figures"]["depth"] == 3
    assert cards["rss.ingest-dlq"]["source"] == "queue_dead_letters table"
    assert cards["rss.ingest"]["figures"]["depth"] is None, "in process: no backlog, not a zero"
    assert cards["ledger"]["error"] is None, "nothing configured is not an error"
    assert "no Redis is configured" in cards["ledger"]["notConfigured"]
    assert cards["ledger"]["figures"] is None
    page = client.get("/admin/queues").text
    card = page.split('data-card="rss.ingest-dlq"')[1].split("</section>")[0]
    assert "<dt>Depth</dt><dd>3</dd>" in card and "<dt>Dead</dt><dd>3</dd>" in card
    ledger = page.split('data-card="ledger"')[1].split("</section>")[0]
    assert 'data-state="not-configured"' in ledger and "<dd>0</dd>" not in ledger
    assert 'class="card failing' not in page.split('data-card="ledger"')[0].rsplit("<section", 1)[1]
    assert 'role="alert"' not in ledger
    dlq = client.get("/admin/dlq").text
    row = dlq.split('href="/admin/dlq/ledger"')[0].rsplit("<tr", 1)[1]
    assert "failing" not in row and "not configured" in dlq.split('href="/admin/dlq/ledger"')[1]


def test_dead_letters_are_paginated_newest_first(sqlite_url: str, make_services: Any) -> None:
    services = make_services(sqlite_url)
    _dead(services, 5)
    client = _client(services, ["ops"])
    one = client.get("/api/admin/console/dlq/rss.ingest?page=1&size=2").json()
    two = client.get("/api/admin/console/dlq/rss.ingest?page=2&size=2").json()
    three = client.get("/api/admin/console/dlq/rss.ingest?page=3&size=2").json()
    assert (one["depth"], one["pages"]) == (5, 3)
    reasons = [i["reason"] for page in (one, two, three) for i in page["items"]]
    assert reasons == ["boom 4", "boom 3", "boom 2", "boom 1", "boom 0"]
    assert one["items"][0]["deliveryCount"] == 5
    html = client.get("/admin/dlq/rss.ingest?page=2&size=2").text
    assert "boom 3" not in html and "boom 2" in html and "boom 1" in html
    assert "Page 2 of 3" in html


def test_an_unreachable_store_shows_its_error(sqlite_url: str, make_services: Any) -> None:
    services = make_services(sqlite_url, SLUICE_REDIS_URL="redis://127.0.0.1:1/0")
    data = _client(services, ["ops"]).get("/api/admin/console/overview").json()
    ledger = next(c for c in data["cards"] if c["key"] == "ledger")
    assert ledger["error"] and ledger["figures"] is None


def test_unknown_parameters_are_refused(sqlite_url: str, make_services: Any) -> None:
    client = _client(make_services(sqlite_url), ["ops"])
    page = client.get("/admin/queues?refresh=1")
    assert page.status_code == 400 and "refresh" in page.text
    assert client.get("/api/admin/console/dlq/rss.ingest?page=0").status_code == 400
    assert client.get("/api/admin/console/dlq/rss.ingest?page=1&size=10").status_code == 200


def test_a_post_without_the_csrf_token_changes_nothing(sqlite_url: str,
                                                       make_services: Any) -> None:
    services = make_services(sqlite_url, SLUICE_QUEUE_SIGNING_SECRET=SIGNING)
    ids = _dead(services, 1)
    client = _client(services, ["ops"])
    refused = client.post("/admin/dlq/rss.ingest/purge",
                          data={"scope": "one", "ids": ids, "confirm": "1"})
    assert refused.status_code == 400 and "CSRF" in refused.text
    forged = client.post("/admin/dlq/rss.ingest/purge",
                         data={"scope": "one", "ids": ids, "confirm": "1", "csrf": "0" * 64})
    assert forged.status_code == 400
    other_site = client.post("/admin/dlq/rss.ingest/purge", headers={"origin": "https://evil.example"},
                             data={"scope": "one", "ids": ids, "confirm": "1",
                                   "csrf": _csrf(client.get("/admin/dlq/rss.ingest").text)})
    assert other_site.status_code == 403
    extra = client.post("/admin/dlq/rss.ingest/purge",
                        data={"scope": "one", "ids": ids, "confirm": "1", "force": "1",
                              "csrf": _csrf(client.get("/admin/dlq/rss.ingest").text)})
    assert extra.status_code == 400 and "force" in extra.text
    assert LocalDeadLetters(services.db).count("rss.ingest") == 1
    audit = RunStore(services.db).recent_audit()
    assert {(a["action"], a["outcome"]) for a in audit} >= {("dlq:purge", "400"),
                                                          ("dlq:purge", "403")}


def test_redrive_previews_then_confirms_and_purge_confirms(db_url: str,
                                                          make_services: Any) -> None:
    services = make_services(db_url, SLUICE_QUEUE_SIGNING_SECRET=SIGNING)
    first, second, third = _dead(services, 3)
    client = _client(services, ["ops"])
    csrf = _csrf(client.get("/admin/dlq/rss.ingest").text)

    preview = client.post("/admin/dlq/rss.ingest/redrive",
                          data={"csrf": csrf, "scope": "selected", "ids": [first, second]})
    assert preview.status_code == 200 and "Confirm redrive of 2" in preview.text
    assert LocalDeadLetters(services.db).count("rss.ingest") == 3, "a dry run changes nothing"
    done = client.post("/admin/dlq/rss.ingest/redrive",
                       data={"csrf": csrf, "scope": "selected", "ids": [first, second],
                             "confirm": "1"})
    assert done.status_code == 200 and "Redriven: 2" in done.text
    assert LocalDeadLetters(services.db).count("rss.ingest") == 1

    ask = client.post("/admin/dlq/rss.ingest/purge", data={"csrf": csrf, "scope": "all"})
    assert "Confirm purge" in ask.text and LocalDeadLetters(services.db).count("rss.ingest") == 1
    gone = client.post("/admin/dlq/rss.ingest/purge",
                       data={"csrf": csrf, "scope": "all", "confirm": "1"})
    assert "Purged: 1" in gone.text and LocalDeadLetters(services.db).count("rss.ingest") == 0
    actions = [(a["action"], a["outcome"], a["actor"]) for a in RunStore(services.db).recent_audit()]
    assert ("dlq:redrive", "200", "admin-1") in actions
    assert [a for a in actions if a[0] == "dlq:redrive"].count(("dlq:redrive", "200", "admin-1")) \
        == 1, "the preview left no row"
    assert ("dlq:redrive", "ok", "admin-1") in actions
    assert ("dlq:purge", "ok", "admin-1") in actions
    assert third  # purged with "all"


def _ended(client: TestClient, location: str) -> dict[str, Any]:
    """Poll a handed-off run's JSON twin until the run has ended (the job's own thread)."""
    twin = location.replace("/admin/jobs/", "/api/admin/console/jobs/")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        data: dict[str, Any] = client.get(twin).json()
        if data["state"] == "ended":
            return data
        time.sleep(0.05)
    raise AssertionError(f"the run behind {location} did not end: {data}")


def test_run_now_confirms_then_hands_the_run_to_the_job(db_url: str,
                                                       make_services: Any) -> None:
    services = make_services(db_url)
    client = _client(services, ["ops"])
    csrf = _csrf(client.get("/admin/jobs").text)
    ask = client.post("/admin/jobs/state-cleanup/run", data={"csrf": csrf})
    assert "Confirm: run state-cleanup" in ask.text
    assert RunStore(services.db).recent("state-cleanup") == []
    handed = client.post("/admin/jobs/state-cleanup/run", data={"csrf": csrf, "confirm": "1"},
                         follow_redirects=False)
    assert handed.status_code == 303, handed.text
    location = handed.headers["location"]
    assert re.fullmatch(r"/admin/jobs/state-cleanup/runs/[0-9a-f-]{36}", location)
    data = _ended(client, location)
    assert (data["run"]["trigger"], data["run"]["outcome"]) == ("admin", "ok")
    assert "deletedSamples" in data["run"]["result"]
    page = client.get(location)
    assert 'data-state="ended"' in page.text and "deletedSamples" in page.text
    assert 'data-refresh' not in page.text, "an ended run's page stops refreshing"
    [run] = RunStore(services.db).recent("state-cleanup")
    assert run["request_id"] == data["runId"]
    audited = [(a["action"], a["outcome"], a["actor"])
               for a in RunStore(services.db).recent_audit()]
    assert ("state-cleanup:handoff", "303", "admin-1") in audited
    assert ("state-cleanup:admin", "200", "admin-1") in audited, "the job's run, as its POST"
    ips = {a["action"]: a["ip"] for a in RunStore(services.db).recent_audit()}
    assert ips["state-cleanup:admin"] == ips["state-cleanup:handoff"], "the operator's address"
    jobs = client.get("/api/admin/console/jobs").json()["jobs"]
    cleanup = next(j for j in jobs if j["job"] == "state-cleanup")
    assert cleanup["runs"][0]["id"] == run["id"] and cleanup["nextRunAt"]
    ops_only = _client(services, ["ops"])
    refused = ops_only.post("/admin/jobs/metering-flush/run",
                            data={"csrf": csrf, "confirm": "1"})
    assert refused.status_code == 403, "run now needs the job's own surface"


def test_a_run_page_waits_for_a_run_not_yet_recorded(sqlite_url: str,
                                                     make_services: Any) -> None:
    client = _client(make_services(sqlite_url), ["ops"])
    waiting = client.get("/admin/jobs/state-cleanup/runs/not-started-yet")
    assert waiting.status_code == 200 and 'data-state="waiting"' in waiting.text
    assert 'data-refresh="3"' in waiting.text
    assert client.get("/admin/jobs/nope/runs/x").status_code == 404
    assert client.get("/admin/jobs/state-cleanup/runs/x?y=1").status_code == 400


def test_flags_are_edited_from_the_page(db_url: str, make_services: Any) -> None:
    services = make_services(db_url)
    client = _client(services, ["super_admin"])
    from sluice.rss.store import RssStore

    RssStore(services.db).put_scope("t-9", "tenant-9", (), "en", True)
    page = client.get("/admin/flags").text
    csrf = _csrf(page)
    assert 'data-override-note="rssQueuePipeline"' in page, "the page says why overrides do nothing"
    ask = client.post("/admin/flags", data={"csrf": csrf, "key": "rssQueuePipeline",
                                            "enabled": "true"}, follow_redirects=False)
    assert ask.status_code == 200 and "Confirm: turn RSS queue pipeline on" in ask.text
    flags = FlagStore(services.state)
    assert not flags.enabled("rssQueuePipeline"), "the global switch asks first"
    assert not [a for a in RunStore(services.db).recent_audit() if a["action"] == "flags:set"]
    on = client.post("/admin/flags", data={"csrf": csrf, "key": "rssQueuePipeline",
                                           "enabled": "true", "confirm": "1"},
                     follow_redirects=False)
    assert on.status_code == 303
    assert "Set override" not in page, "no form for an override the flag would not honour"
    refused = client.post("/admin/flags", data={"csrf": csrf, "key": "rssQueuePipeline",
                                                "enabled": "false", "tenantScopeId": "t-9"})
    assert refused.status_code == 400 and "would change nothing" in refused.text
    assert flags.overrides("rssQueuePipeline") == {}
    # One stored before overrides were refused is listed with its clear button only.
    flags.set("rssQueuePipeline", False, "t-9")
    listed = client.get("/admin/flags").text
    assert "Clear override of t-9" in listed and "Turn on for t-9" not in listed
    client.post("/admin/flags", data={"csrf": csrf, "key": "rssQueuePipeline",
                                      "tenantScopeId": "t-9", "clearOverride": "1"})
    assert flags.overrides("rssQueuePipeline") == {}
    bad = client.post("/admin/flags", data={"csrf": csrf, "key": "rssQueuePipeline",
                                            "enabled": "yes"})
    assert bad.status_code == 400


def test_the_login_link_works_once_and_sets_a_strict_cookie(sqlite_url: str,
                                                            make_services: Any) -> None:
    services = make_services(sqlite_url)
    summary = startup_summary(services, "https://testserver")
    match = re.search(r"/admin/login\?nonce=(\S+)", summary)
    assert match
    client = TestClient(create_app(services), base_url="https://testserver")
    first = client.get(f"/admin/login?nonce={match.group(1)}", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == "/admin"
    cookie = first.headers["set-cookie"]
    assert "__session=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Secure" in cookie
    # /admin, the session's landing page: a login link's session has every role
    home = client.get("/admin", follow_redirects=False)
    assert home.status_code == 303 and home.headers["location"] == "/admin/queues"
    assert client.get("/admin/queues").status_code == 200
    again = TestClient(create_app(services)).get(f"/admin/login?nonce={match.group(1)}",
                                                 follow_redirects=False)
    assert again.status_code == 401 and "used or expired" in again.text
    logins = [(a["actor"], a["outcome"]) for a in RunStore(services.db).recent_audit()
              if a["action"] == "console:login"]
    assert sorted(logins) == [("anonymous", "401"), ("local-dev", "ok")]


def test_no_login_link_on_lambda(sqlite_url: str, make_services: Any,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    services = make_services(sqlite_url)
    summary = startup_summary(services, "http://127.0.0.1:8787")
    nonce = re.search(r"nonce=(\S+)", summary)
    assert nonce
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "sluice-test-http")
    assert "nonce=" not in startup_summary(services, "http://127.0.0.1:8787")
    refused = TestClient(create_app(services)).get(f"/admin/login?nonce={nonce.group(1)}",
                                                   follow_redirects=False)
    assert refused.status_code == 401


def test_erasure_and_deliveries_act_like_the_cli(db_url: str, make_services: Any) -> None:
    from sluice.delivery.store import DeliveryStore
    from sluice.erasure.requests import ErasureStore

    services = make_services(db_url)
    request, _ = ErasureStore(services.db).create("user-5", requested_by="op", grace_days=7)
    store = DeliveryStore(services.db)
    entry, _ = store.enqueue("webhook", "https://hooks.example/a", {"text": "x"})
    [claimed] = store.claim(timedelta(seconds=60))
    store.fail(claimed, "410 gone")
    client = _client(services, ["super_admin"])
    csrf = _csrf(client.get("/admin/erasure").text)
    preview = client.post(f"/admin/erasure/{request.id}/confirm", data={"csrf": csrf})
    assert "Dry run" in preview.text and ErasureStore(services.db).get(request.id).status == \
        request.status
    client.post(f"/admin/erasure/{request.id}/cancel", data={"csrf": csrf, "confirm": "1"})
    assert ErasureStore(services.db).get(request.id).status.value == "cancelled"
    twin = client.get("/api/admin/console/erasure").json()
    assert twin["summary"]["byStatus"]["cancelled"] == 1

    assert client.get("/api/admin/console/deliveries").json()["stats"]["failed"]["count"] == 1
    client.post("/admin/deliveries/redrive", data={"csrf": csrf, "id": entry.id, "confirm": "1"})
    assert store.get(entry.id).status.value == "pending"
    actions = {a["action"] for a in RunStore(services.db).recent_audit()}
    assert {"erasure:cancel", "console:deliveries.action"} <= actions


def test_quarantine_has_a_card_and_refusals_are_shown(db_url: str, make_services: Any) -> None:
    from sluice.queues.deadletters import Quarantine

    services = make_services(db_url, SLUICE_QUEUE_SIGNING_SECRET=SIGNING)
    Quarantine(services.db).add("rss.ingest", "msg-1", "unsigned", '{"topic": "rss.ingest"}')
    unsigned = LocalDeadLetters(services.db).add("rss.ingest", {
        "originalMessageId": "m-x", "errorMessage": "boom", "deliveryCount": 5,
        "originalMessage": {"topic": "rss.ingest", "batchId": "b"}})
    client = _client(services, ["ops"])
    cards = {c["key"]: c for c in client.get("/api/admin/console/overview").json()["cards"]}
    assert cards["quarantine"]["figures"]["depth"] == 1
    assert cards["quarantine"]["source"] == "queue_quarantine table"
    csrf = _csrf(client.get("/admin/dlq/rss.ingest").text)
    preview = client.post("/admin/dlq/rss.ingest/redrive",
                          data={"csrf": csrf, "scope": "one", "ids": [unsigned]})
    assert "Refused (they stay)" in preview.text and "Confirm redrive" not in preview.text
    assert LocalDeadLetters(services.db).count("rss.ingest") == 1
