"""after()-deferred work as the reference documents describe it, in a route of the HTTP app:
its error reaches ``on_error`` and the error sink, never the response (that the work waits
for the response is shown by ``tests/e2e/alerts/test_after_response.py``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from sluice.core.after import run_after_response
from sluice.core.services import Services
from sluice.http.app import create_app
from tests.e2e.alerts.test_after_response import Sink


def client_with_route(services: Services, events: list[str], sink: Sink, *,
                      work_fails: bool, on_error_fails: bool = False) -> TestClient:
    app = create_app(services)

    def work() -> None:
        events.append("work")
        if work_fails:
            raise RuntimeError("deferred work failed")

    def on_error(exc: BaseException) -> None:
        events.append(f"on_error: {exc}")
        if on_error_fails:
            raise ValueError("the handler failed too")

    @app.get("/api/app/thing")
    def thing() -> dict[str, bool]:
        run_after_response(work, on_error, reporter=sink)
        events.append("handler")
        return {"ok": True}

    return TestClient(app, raise_server_exceptions=True)


@pytest.mark.parametrize("on_error_fails", [False, True])
def test_the_works_error_reaches_on_error_and_the_sink_never_the_response(
        on_error_fails: bool, sqlite_url: str, make_services: Callable[..., Services]) -> None:
    events: list[str] = []
    sink = Sink()
    client = client_with_route(make_services(sqlite_url), events, sink, work_fails=True,
                               on_error_fails=on_error_fails)
    response = client.get("/api/app/thing")
    assert (response.status_code, response.json()) == (200, {"ok": True})
    assert events == ["handler", "work", "on_error: deferred work failed"]
    expected = [("after-response", "deferred work failed")]
    if on_error_fails:
        expected.insert(0, ("after-response.on_error", "the handler failed too"))
    assert sink.errors == expected
