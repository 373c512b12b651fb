"""/api/docs in Debian's Chromium (via Playwright): Swagger UI renders the API from assets
served by the app itself, under its CSP, and no request goes anywhere but 127.0.0.1."""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import uvicorn

from sluice.http.app import create_app


@pytest.fixture
def base_url(sqlite_url: str, make_services: Any) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(create_app(make_services(sqlite_url)),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def test_api_docs_render_offline(base_url: str) -> None:
    from playwright.sync_api import Route, sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: apt-get install -y chromium (tests/run does)"
    requested: list[str] = []
    refused: list[str] = []
    console: list[str] = []

    def only_loopback(route: Route) -> None:
        url = route.request.url
        requested.append(url)
        if urlsplit(url).hostname == "127.0.0.1" or url.startswith("data:"):
            route.continue_()
        else:  # never let it reach the network; the assertion below names it
            refused.append(url)
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium,
                                     args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page()
            page.route("**/*", only_loopback)
            page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
            page.goto(f"{base_url}/api/docs")
            page.wait_for_selector(".opblock", timeout=30_000)
            title = page.locator(".info .title").inner_text()
            operations = page.locator(".opblock").count()
            paths = page.eval_on_selector_all(".opblock-summary-path",
                                              "els => els.map(e => e.textContent)")
        finally:
            browser.close()

    assert refused == [], f"requests that tried to leave the machine: {refused}"
    assert title.startswith("Sluice")
    assert operations > 20 and any("/api/admin/delivery" in p for p in paths)
    assert f"{base_url}/api/openapi.json" in requested
    assert not [m for m in console if "Content Security Policy" in m], console
