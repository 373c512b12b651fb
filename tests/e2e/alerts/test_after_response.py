"""run_after_response inside HTTP requests: the work runs after the response's last
message; an error in it never changes or fails the response and always reaches the sink
(also when the app is served by Mangum, as on Lambda, where it runs before the handler
returns); the new-stories evaluation of the real app takes this path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from mangum import Mangum

from sluice.alerts import evaluate as alerts_evaluate
from sluice.core.after import run_after_response
from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.http.after import install
from sluice.http.app import create_app
from sluice.rss.store import RssStore
from tests.conftest import CRON_SECRET, load_event
from tests.lambda_context import LambdaContext
from tests.providers.feeds import FeedServer, rss_document
from tests.rss_support import FEED_ENV


class Sink(Reporter):
    def __init__(self) -> None:
        super().__init__()
        self.errors: list[tuple[str, str]] = []

    def error(self, context: str, exc: BaseException | None = None, **extra: Any) -> None:
        self.errors.append((context, str(exc)))


def mini_app(events: list[str], sink: Sink, *, fail: bool) -> FastAPI:
    app = FastAPI()

    def work() -> None:
        events.append("work")
        if fail:
            raise RuntimeError("deferred work failed")

    @app.get("/thing")
    def thing() -> dict[str, bool]:
        run_after_response(work, lambda exc: events.append(f"on_error: {exc}"), reporter=sink)
        events.append("handler")
        return {"ok": True}

    install(app)
    return app


def call(app: FastAPI, events: list[str]) -> None:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "path": "/thing", "raw_path": b"/thing", "query_string": b"",
             "headers": [], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
             "scheme": "http", "root_path": ""}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            events.append(f"start {message['status']}")
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            events.append("sent")

    asyncio.run(app(scope, receive, send))


@pytest.mark.parametrize("fail", [False, True])
def test_the_work_runs_after_the_response_was_sent(fail: bool) -> None:
    events: list[str] = []
    sink = Sink()
    call(mini_app(events, sink, fail=fail), events)
    expected = ["handler", "start 200", "sent", "work"]
    if fail:
        expected.append("on_error: deferred work failed")
    assert events == expected
    assert sink.errors == ([("after-response", "deferred work failed")] if fail else [])


def test_in_the_real_app_the_work_runs_after_its_response_outside_every_middleware(
        sqlite_url: str, make_services: Callable[..., Services]) -> None:
    # create_app installs the collector last, so it wraps every other middleware: the
    # work waits for the response's last message, not for an inner layer's.
    events: list[str] = []
    sink = Sink()
    app = create_app(make_services(sqlite_url))

    def work() -> None:
        events.append("work")

    @app.get("/thing")
    def thing() -> dict[str, bool]:
        run_after_response(work, lambda exc: events.append(f"on_error: {exc}"), reporter=sink)
        events.append("handler")
        return {"ok": True}

    call(app, events)
    assert events == ["handler", "start 200", "sent", "work"]
    assert sink.errors == []


def test_under_mangum_it_runs_before_the_handler_returns_and_never_fails_it() -> None:
    events: list[str] = []
    sink = Sink()
    handler = Mangum(mini_app(events, sink, fail=True), lifespan="off")
    event = load_event("http_get_cron")
    event.update({"rawPath": "/thing", "rawQueryString": ""})
    event["requestContext"]["http"].update({"path": "/thing", "method": "GET"})
    answer = handler(event, LambdaContext())
    assert answer["statusCode"] == 200 and answer["body"] == '{"ok":true}'
    assert events == ["handler", "work", "on_error: deferred work failed"]
    assert sink.errors == [("after-response", "deferred work failed")]


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


def test_new_story_evaluation_in_a_tick_runs_in_the_tick_and_its_error_is_counted(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    svc = make_services(db_url, **FEED_ENV, SLUICE_RSS_SCOPE_MIN_INTERVAL_SECONDS="0")
    sink = svc.reporter = Sink()
    store = RssStore(svc.db)
    source = store.add_source(feeds.add_rss("/wire", items=2)).id
    store.put_scope("acme", "tenant-acme", (source,), "en", True)
    client = TestClient(create_app(svc), raise_server_exceptions=False)
    cron = {"authorization": f"Bearer {CRON_SECRET}"}
    assert client.get("/api/admin/rss/refresh", headers=cron).status_code == 200

    calls: list[bool] = []

    def broken(*args: Any) -> Any:
        from sluice.core.after import collector

        calls.append(collector.get() is None)  # None: running after the request's work
        raise RuntimeError("evaluation exploded")

    monkeypatch.setattr(alerts_evaluate, "evaluate_new_stories", broken)
    feeds.feeds["/wire"].set(rss_document("wire", 4))
    answer = client.get("/api/admin/rss/refresh", headers=cron)
    # inside a tick the new stories' alerts run before the answer, so it counts them
    assert answer.status_code == 200 and answer.json()["failed"] == 1
    assert answer.json()["newStoryAlerts"] == {"enqueued": 0, "failed": 1}
    assert calls == [False]
    assert ("rss.on_new_stories", "evaluation exploded") in sink.errors
