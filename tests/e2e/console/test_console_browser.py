"""The console in a real browser (Playwright driving Debian's Chromium, no browser download):
log in through the local link, see every page, redrive after a dry run, purge, run a job now,
flip a flag, check the audit trail, and the accessibility basics. Screenshots of every page
go to artifacts/console/ (git-ignored)."""

from __future__ import annotations

import itertools
import re
import shutil
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
import uvicorn

from sluice.cli.dev import startup_summary
from sluice.core.services import Services
from sluice.delivery.store import DeliveryStore
from sluice.erasure.requests import ErasureStore
from sluice.http.app import create_app
from sluice.jobs.runs import RunStore
from sluice.queues.deadletters import LocalDeadLetters
from sluice.queues.signing import Signer
from sluice.store.db import utcnow
from sluice.store.flags import FlagStore
from sluice.store.history import HistoryStore, Sample
from tests.conftest import ROOT

SIGNING = "signing-secret-0123456789"
SHOTS = ROOT / "artifacts" / "console"
PAGES = ["/admin/queues", "/admin/history", "/admin/dlq", "/admin/dlq/rss.ingest",
         "/admin/jobs", "/admin/deliveries", "/admin/erasure", "/admin/flags"]

HEADINGS = "() => [...document.querySelectorAll('h1,h2,h3,h4,h5,h6')].map(h => +h.tagName[1])"
UNLABELLED = """() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
  .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label'))
  .map(e => e.outerHTML)"""
UNREACHABLE = """() => [...document.querySelectorAll('button, a[href]')]
  .filter(e => e.offsetParent !== null)
  .filter(e => { e.focus(); return document.activeElement !== e || e.tabIndex < 0; })
  .map(e => e.outerHTML.slice(0, 120))"""
NAMELESS = """() => [...document.querySelectorAll('button, a[href]')]
  .filter(e => !e.textContent.trim() && !e.getAttribute('aria-label')).map(e => e.outerHTML)"""


def chromium() -> str:
    path = shutil.which("chromium")
    assert path, "Debian's chromium is missing: apt-get install -y chromium (tests/run does)"
    return path


@pytest.fixture
def served(sqlite_url: str, make_services: Any) -> Iterator[tuple[str, Services]]:
    services: Services = make_services(sqlite_url,
                                       SLUICE_QUEUE_SIGNING_SECRET=SIGNING)
    with serving(services) as base:
        yield base, services


@contextmanager
def serving(services: Services) -> Iterator[str]:
    """The app under uvicorn on 127.0.0.1, on a socket bound before the server thread starts."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections queue here until the server accepts them
    server = uvicorn.Server(uvicorn.Config(create_app(services), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def _seed(services: Services) -> list[str]:
    message = {"topic": "rss.ingest", "batchId": "b1", "sourceId": "s1",
               "feedUrl": "https://feeds.example/a.xml", "publishedAt": "2026-01-01T00:00:00Z"}
    message = Signer([SIGNING]).sign(message)
    ids = [LocalDeadLetters(services.db).add("rss.ingest", {
        "originalMessageId": f"m{i}", "originalTopic": "rss.ingest", "deliveryCount": 5,
        "failedAt": (utcnow() - timedelta(minutes=10 * (3 - i))).isoformat(),
        "errorMessage": f"feed fetch failed: HTTP 50{i}", "originalMessage": message})
        for i in range(3)]
    ErasureStore(services.db).create("user-42", requested_by="op", grace_days=7)
    deliveries = DeliveryStore(services.db)
    deliveries.enqueue("webhook", "https://hooks.example/ok", {"text": "queued"})
    deliveries.enqueue("slack", "C0123", {"text": "will fail"})
    for entry in deliveries.claim(timedelta(seconds=60), limit=5):
        if entry.channel == "slack":
            deliveries.fail(entry, "channel_not_found")
        else:
            deliveries.nack(entry, "HTTP 503")
    now = utcnow()
    HistoryStore(services.db).add(
        [Sample("depth", "rss.ingest-dlq", now - timedelta(hours=h), float(h % 5))
         for h in range(1, 60, 3)]
        + [Sample("job", "state-cleanup", now - timedelta(hours=h), 40.0 + h,
                  "error" if h == 30 else "ok") for h in range(6, 150, 12)])
    return ids


@contextmanager
def logged_in(base: str, services: Services) -> Iterator[Any]:
    """A Chromium page logged in to the console through ``sluice dev``'s login link."""
    from playwright.sync_api import sync_playwright

    link = re.search(r"(http://\S+/admin/login\?nonce=\S+)", startup_summary(services, base))
    assert link, "sluice dev prints a login link"
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(),
                                     args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.goto(link.group(1))
            yield page
        finally:
            browser.close()


def _check_accessibility(page: Any, path: str) -> None:
    levels = page.evaluate(HEADINGS)
    assert levels[0] == 1 and levels.count(1) == 1, f"{path}: one h1, first"
    assert all(b - a <= 1 for a, b in itertools.pairwise(levels)), f"{path}: heading order {levels}"
    assert page.evaluate(UNLABELLED) == [], f"{path}: every control has a label"
    assert page.evaluate(NAMELESS) == [], f"{path}: every action has a name"
    assert page.evaluate(UNREACHABLE) == [], f"{path}: every action takes keyboard focus"


def _tab_to(page: Any, element_id: str, presses: int = 80) -> None:
    for _ in range(presses):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement && document.activeElement.id") == \
                element_id:
            return
    raise AssertionError(f"#{element_id} is not reachable with the keyboard")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_console_in_a_browser(served: tuple[str, Services]) -> None:
    from playwright.sync_api import sync_playwright

    base, services = served
    first, *_ = _seed(services)
    link = re.search(r"(http://\S+/admin/login\?nonce=\S+)", startup_summary(services, base))
    assert link, "sluice dev prints a login link"
    SHOTS.mkdir(parents=True, exist_ok=True)
    dead = LocalDeadLetters(services.db)
    csp_errors: list[str] = []

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(),
                                     args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            page = context.new_page()
            page.on("console", lambda m: csp_errors.append(m.text)
                    if "Content Security Policy" in m.text else None)
            page.goto(link.group(1))
            assert page.url == f"{base}/admin/queues"
            assert page.locator("h1").inner_text() == "Queue health"
            cookie = next(c for c in context.cookies() if c["name"] == "__session")
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

            for path in PAGES:
                page.goto(base + path)
                assert page.locator("h1").count() == 1, path
                _check_accessibility(page, path)
                page.evaluate("() => document.activeElement && document.activeElement.blur()")
                page.screenshot(path=str(SHOTS / f"{path.strip('/').replace('/', '_')}.png"),
                                full_page=True)
            phone = browser.new_context(viewport={"width": 390, "height": 844},
                                        storage_state=context.storage_state())
            mobile = phone.new_page()
            for path in ("/admin/queues", "/admin/dlq/rss.ingest"):
                mobile.goto(base + path)
                width = mobile.evaluate("() => document.documentElement.scrollWidth")
                assert width <= 390, f"{path} fits a phone ({width}px)"
                name = f"phone_{path.strip('/').replace('/', '_')}"
                mobile.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
                mobile.screenshot(path=str(SHOTS / f"{name}_top.png"))
            phone.close()

            # Redrive one dead letter: select it, dry run, then confirm with the keyboard.
            page.goto(f"{base}/admin/dlq/rss.ingest")
            page.get_by_label(f"Select {first}").check()
            page.get_by_role("button", name="Redrive selected (dry run first)").click()
            assert "Confirm redrive of 1" in page.locator("main").inner_text()
            assert dead.count("rss.ingest") == 3, "the dry run changed nothing"
            page.screenshot(path=str(SHOTS / "dlq_redrive_preview.png"), full_page=True)
            _tab_to(page, "confirm")
            page.keyboard.press("Enter")
            page.wait_for_selector("text=Redriven: 1")
            assert dead.count("rss.ingest") == 2

            # Purge one from its row, after the confirmation page.
            page.goto(f"{base}/admin/dlq/rss.ingest")
            second = page.locator("input[name=ids]").first.get_attribute("value")
            page.get_by_role("button", name=f"Purge {second}", exact=True).click()
            page.get_by_role("button", name="Confirm purge").click()
            page.wait_for_selector("text=Purged: 1")
            assert dead.count("rss.ingest") == 1
            assert second not in {row["id"] for row in dead.list("rss.ingest", 10)}

            # Run a job now.
            page.goto(f"{base}/admin/jobs")
            page.get_by_role("button", name="Run state-cleanup now…").click()
            page.get_by_role("button", name="Confirm: run state-cleanup").click()
            assert page.locator("main .badge").first.inner_text() == "ok"
            page.screenshot(path=str(SHOTS / "job_run.png"), full_page=True)

            # Flip the flag.
            page.goto(f"{base}/admin/flags")
            page.get_by_role("button", name="Turn RSS queue pipeline on globally…").click()
            assert not FlagStore(services.state).enabled("rssQueuePipeline"), "asked first"
            page.get_by_role("button", name="Confirm: turn RSS queue pipeline on").click()
            page.wait_for_selector("text=Saved rssQueuePipeline")
            assert page.locator('[data-global="rssQueuePipeline"]').inner_text() == "on"
            assert FlagStore(services.state).enabled("rssQueuePipeline")
            page.screenshot(path=str(SHOTS / "flags_after.png"), full_page=True)
        finally:
            browser.close()

    assert csp_errors == [], "nothing on the pages breaks the CSP"
    audit = {(a["action"], a["outcome"], a["actor"])
             for a in RunStore(services.db).recent_audit(100)}
    assert ("dlq:redrive", "dry_run", "local-dev") not in audit, "a preview is not an action"
    for row in [("dlq:redrive", "200", "local-dev"),
                ("dlq:redrive", "ok", "local-dev"), ("dlq:purge", "200", "local-dev"),
                ("dlq:purge", "ok", "local-dev"), ("state-cleanup:admin", "200", "local-dev"),
                ("flags:set", "303", "local-dev")]:
        assert row in audit, row
    [run, *_] = RunStore(services.db).recent("state-cleanup")
    assert (run["trigger"], run["outcome"]) == ("admin", "ok")
