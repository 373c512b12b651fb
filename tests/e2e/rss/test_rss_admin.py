"""RSS ingestion's admin surface over HTTP and the command line, on both backends: roles,
sources and scopes with typed 4xx naming the field, build-free stories, the tick's cron
GET and admin POST, unhonoured query parameters, the audit trail."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.http.app import create_app
from sluice.jobs.runs import RunStore
from tests.conftest import BASE_ENV, CRON_SECRET, admin_token, run_cli
from tests.providers.feeds import Feed, FeedServer
from tests.rss_support import FEED_ENV

BASE = "/api/admin/rss"


def ops() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['ops'], subject='ops-1')}"}


def billing() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['billing'], subject='bill-1')}"}


CRON = {"authorization": f"Bearer {CRON_SECRET}"}


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return {**BASE_ENV, **FEED_ENV, "SLUICE_DATABASE_URL": db_url}


@pytest.fixture
def svc(env: dict[str, str], make_services: Callable[..., Services]) -> Services:
    return make_services(env["SLUICE_DATABASE_URL"], **FEED_ENV)


@pytest.fixture
def client(svc: Services) -> TestClient:
    return TestClient(create_app(svc), raise_server_exceptions=False)


def test_sources_scopes_stories_and_the_tick_over_http(client: TestClient, svc: Services,
                                                       feeds: FeedServer) -> None:
    made = client.post(f"{BASE}/sources", json={"url": feeds.add_rss("/a", items=3),
                                                 "title": "A", "global": True}, headers=ops())
    assert made.status_code == 201, made.text
    source = made.json()
    assert source["global"] is True and source["fetchState"]["lastSuccessAt"] is None
    other = client.post(f"{BASE}/sources", json={"url": feeds.add_atom("/b", items=2)},
                        headers=ops()).json()
    listed = client.get(f"{BASE}/sources", headers=ops()).json()["sources"]
    assert [s["id"] for s in listed] == [source["id"], other["id"]]

    put = client.put(f"{BASE}/scopes/newsroom-1", headers=ops(), json={
        "tenantId": "acme", "sourceIds": [source["id"], other["id"]], "locale": "en",
        "completed": True})
    assert put.status_code == 200, put.text
    assert put.json()["sourceIds"] == [source["id"], other["id"]]
    assert client.get(f"{BASE}/scopes", headers=ops()).json()["scopes"][0]["scopeId"] == \
        "newsroom-1"

    before = client.get(f"{BASE}/scopes/newsroom-1/stories", headers=ops()).json()
    assert before == {"scopeId": "newsroom-1", "builtAt": None, "stories": []}
    assert sum(feeds.hits.values()) == 0  # reading stories never builds

    tick = client.get("/api/admin/rss/refresh", headers=CRON)
    assert tick.status_code == 200, tick.text
    assert tick.json()["tenantIngestion"]["refreshed"] == 1
    assert tick.json()["inlineRefreshed"] is True

    stories = client.get(f"{BASE}/scopes/newsroom-1/stories", params={"limit": 2},
                         headers=ops()).json()
    assert stories["builtAt"] is not None and len(stories["stories"]) == 2
    assert set(stories["stories"][0]) == {"id", "title", "link", "publishedAt", "summary",
                                          "sourceId"}
    shown = client.get(f"{BASE}/sources/{source['id']}", headers=ops()).json()
    assert shown["fetchState"]["lastStatus"] == 200 and shown["fetchState"]["etag"]

    in_use = client.delete(f"{BASE}/sources/{source['id']}", headers=ops())
    assert in_use.status_code == 409 and in_use.json()["error"]["scopes"] == ["newsroom-1"]
    assert client.delete(f"{BASE}/scopes/newsroom-1", headers=ops()).json() == {
        "removed": "newsroom-1"}
    assert client.get(f"{BASE}/scopes/newsroom-1", headers=ops()).status_code == 404
    assert client.delete(f"{BASE}/sources/{source['id']}", headers=ops()).status_code == 200
    assert client.get(f"{BASE}/sources/{source['id']}", headers=ops()).status_code == 404

    admin = client.post("/api/admin/rss/refresh", headers=ops())
    assert admin.status_code == 200 and admin.json()["tenantIngestion"]["tenantScopes"] == 0
    actions = {(a["actor"], a["action"], a["outcome"]) for a in RunStore(svc.db).recent_audit()}
    assert {("ops-1", "rss:source_add", "201"), ("ops-1", "rss:scope_set", "200"),
            ("ops-1", "rss:source_remove", "409"), ("ops-1", "rss-refresh:admin", "200")
            } <= actions


def test_a_title_with_markup_is_served_as_text(client: TestClient, svc: Services,
                                               feeds: FeedServer) -> None:
    """Stored plain, so an app that renders the API's titles as HTML renders no tag."""
    feeds.feeds["/x"] = Feed(
        b'<rss version="2.0"><channel><title>x</title><item><title>Breaking &lt;img src=x '
        b"onerror=alert(3)&gt; news &amp;amp; more</title><link>https://n.example/1</link>"
        b'</item></channel></rss>')
    source = client.post(f"{BASE}/sources", json={"url": f"{feeds.url}/x"},
                         headers=ops()).json()
    client.put(f"{BASE}/scopes/xss", headers=ops(), json={
        "tenantId": "acme", "sourceIds": [source["id"]], "locale": "en"})
    assert client.get("/api/admin/rss/refresh", headers=CRON).status_code == 200
    stories = client.get(f"{BASE}/scopes/xss/stories", headers=ops()).json()["stories"]
    assert [s["title"] for s in stories] == ["Breaking news & more"]


@pytest.mark.parametrize(("body", "field"), [
    ({"url": "ftp://feeds.example/rss"}, "url"),
    ({"url": "http://169.254.169.254/latest/meta-data/"}, "url"),
    ({"url": "http://10.0.0.7/feed.xml"}, "url"),
    ({"url": "http://127.0.0.2:8080/feed.xml"}, "url"),
    ({"url": "http://localhost/feed"}, "url"),
    ({"title": "no url"}, "url"),
    ({"url": "https://feeds.example/rss", "global": "yes"}, "global"),
    ({"url": "https://feeds.example/rss", "colour": "red"}, "colour"),
])
def test_bad_sources_are_4xx_naming_the_field(client: TestClient, body: dict[str, object],
                                              field: str) -> None:
    answer = client.post(f"{BASE}/sources", json=body, headers=ops())
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == field


def test_bad_scopes_and_parameters_are_4xx(client: TestClient, feeds: FeedServer) -> None:
    source = client.post(f"{BASE}/sources", json={"url": feeds.add_rss("/a")},
                         headers=ops()).json()
    duplicate = client.post(f"{BASE}/sources", json={"url": feeds.url + "/a"}, headers=ops())
    assert duplicate.status_code == 409 and duplicate.json()["error"]["field"] == "url"
    good = {"tenantId": "t", "sourceIds": [source["id"]], "locale": "pt-BR"}
    for change, field in ((({"sourceIds": [source["id"], "src_nope"]}), "sourceIds"),
                          ({"sourceIds": []}, "sourceIds"), ({"locale": "english!"}, "locale"),
                          ({"tenantId": ""}, "tenantId"), ({"completed": "yes"}, "completed")):
        answer = client.put(f"{BASE}/scopes/s1", json={**good, **change}, headers=ops())
        assert answer.status_code == 400, (change, answer.text)
        assert answer.json()["error"]["field"] == field
    assert client.put(f"{BASE}/scopes/s1", json=good, headers=ops()).json()["completed"] is True
    for url, params in ((f"{BASE}/scopes/s1/stories", {"limit": "many"}),
                        (f"{BASE}/scopes/s1/stories", {"limit": "0"}),
                        (f"{BASE}/scopes/s1/stories", {"since": "yesterday"}),
                        (f"{BASE}/sources", {"page": "2"})):
        answer = client.get(url, params=params, headers=ops())
        assert answer.status_code == 400, (url, params)
        assert answer.json()["error"]["parameter"] == next(iter(params))
    refused = client.post("/api/admin/rss/refresh", params={"force": "1"}, headers=ops())
    assert refused.status_code == 400 and refused.json()["error"]["parameter"] == "force"
    cron = client.get("/api/admin/rss/refresh", params={"dryRun": "1"}, headers=CRON)
    assert cron.status_code == 400 and cron.json()["error"]["parameter"] == "dryRun"
    assert client.get(f"{BASE}/scopes/nope/stories", headers=ops()).status_code == 404


def test_roles(client: TestClient) -> None:
    assert client.get(f"{BASE}/sources").status_code == 401
    assert client.get(f"{BASE}/sources", headers=billing()).status_code == 403
    assert client.post("/api/admin/rss/refresh", headers=billing()).status_code == 403
    assert client.get("/api/admin/rss/refresh").status_code == 401
    assert client.get("/api/admin/rss/refresh", headers=ops()).status_code == 401  # not the bearer


def test_the_command_line(env: dict[str, str], svc: Services, feeds: FeedServer) -> None:
    added = run_cli(["rss", "sources", "add", feeds.add_rss("/cli", items=2), "--title", "CLI",
                     "--by", "oncall", "--json"], env)
    assert added.returncode == 0, added.stderr
    source_id = json.loads(added.stdout)["id"]
    refused = run_cli(["rss", "sources", "add", "http://169.254.169.254/"], env)
    assert refused.returncode == 64 and "link-local" in refused.stderr
    scope = run_cli(["rss", "scopes", "set", "cli-scope", "--tenant", "acme", "--source",
                     source_id, "--locale", "en", "--by", "oncall"], env)
    assert scope.returncode == 0 and "tenant=acme" in scope.stdout
    unknown = run_cli(["rss", "scopes", "set", "x", "--tenant", "t", "--source", "src_nope",
                       "--locale", "en"], env)
    assert unknown.returncode == 64 and "unknown source ids: src_nope" in unknown.stderr

    ticked = run_cli(["rss", "refresh", "--json"], env)
    assert ticked.returncode == 0, ticked.stderr
    assert json.loads(ticked.stdout)["tenantIngestion"]["refreshed"] == 1
    stories = json.loads(run_cli(["rss", "stories", "cli-scope", "--json"], env).stdout)
    assert [s["title"] for s in stories["stories"]] == ["cli story 1", "cli story 0"]
    human = run_cli(["rss", "stories", "cli-scope", "--limit", "1"], env)
    assert human.returncode == 0 and "cli story 1" in human.stdout
    listed = run_cli(["rss", "sources", "list"], env)
    assert source_id in listed.stdout and "ok " in listed.stdout
    assert json.loads(run_cli(["rss", "scopes", "list", "--json"], env).stdout)[0][
        "scopeId"] == "cli-scope"
    assert run_cli(["rss", "sources", "remove", source_id], env).returncode == 64  # in use: the state refuses
    assert run_cli(["rss", "scopes", "remove", "cli-scope", "--by", "oncall"],
                   env).returncode == 0
    assert run_cli(["rss", "sources", "remove", source_id, "--by", "oncall"],
                   env).returncode == 0
    actions = {(a["actor"], a["action"]) for a in RunStore(svc.db).recent_audit()}
    assert {("oncall", "rss:source_add"), ("oncall", "rss:scope_set"),
            ("oncall", "rss:scope_remove"), ("oncall", "rss:source_remove")} <= actions
