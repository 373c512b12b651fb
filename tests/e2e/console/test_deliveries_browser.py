"""The deliveries page's destination actions in a real browser (Playwright driving Debian's
Chromium): replay a destination's window, the dry run's preview first, then the confirmed
run and its one audit row. The oracle is the store's rows and the audit trail."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from sluice.cli.dev import startup_summary
from sluice.core.services import Services
from sluice.core.times import iso_z
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.jobs.runs import RunStore
from sluice.store.db import utcnow
from tests.e2e.console.test_console_browser import SHOTS, chromium, serving

DESTINATION = "webhook:hooks.example:8443"


def _seed(services: Services) -> tuple[list[str], list[str]]:
    """10 failed and 5 acknowledged entries to one webhook host, and one failed elsewhere."""
    store = DeliveryStore(services.db)
    for n in range(15):
        store.enqueue("webhook", f"https://hooks.example:8443/in/{n}", {"text": f"m{n}"})
    store.enqueue("webhook", "https://other.example/in", {"text": "elsewhere"})
    failed, acked = [], []
    for entry in store.claim(timedelta(seconds=60), limit=16):
        if entry.payload["text"] in {f"m{n}" for n in range(10, 15)}:
            store.ack(entry, None, 5)
            acked.append(entry.id)
        else:
            store.fail(entry, "HTTP 400")
            failed.append(entry.id)
    return failed, acked


@pytest.fixture
def served(sqlite_url: str, make_services: Any) -> Iterator[tuple[str, Services]]:
    """The console with the webhook channel configured (its adapter names the destinations)."""
    services: Services = make_services(
        sqlite_url, SLUICE_WEBHOOK_SIGNING_SECRET="whsec_" + base64.b64encode(b"k" * 24).decode())
    with serving(services) as base:
        yield base, services


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_replay_a_destinations_window_after_its_dry_run(served: tuple[str, Services]) -> None:
    from playwright.sync_api import sync_playwright

    base, services = served
    since = iso_z(utcnow() - timedelta(hours=1))
    failed, acked = _seed(services)
    store = DeliveryStore(services.db)
    link = re.search(r"(http://\S+/admin/login\?nonce=\S+)", startup_summary(services, base))
    assert link
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(),
                                     args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.goto(link.group(1))
            page.goto(f"{base}/admin/deliveries")
            page.get_by_label("Destination").fill(DESTINATION)
            page.get_by_label("Since").fill(since)
            page.get_by_label("Status to replay").select_option("failed")
            page.get_by_role("button", name="Preview replay…").click()

            # THEN the dry run: 10 would go, 5 of the destination's entries acknowledged
            preview = page.locator("#replay-preview").inner_text()
            assert preview.startswith("10 entries would go out again"), preview
            assert page.locator("#already-acknowledged").inner_text() == "5"
            assert {store.get(i).status for i in failed} == {DeliveryStatus.FAILED}, \
                "the preview changed nothing"
            assert not [r for r in RunStore(services.db).recent_audit()
                        if r["action"] == "delivery:replay"], "a preview leaves no audit row"
            page.screenshot(path=str(SHOTS / "deliveries_replay_preview.png"), full_page=True)

            page.get_by_role("button", name="Confirm replay of 10").click()
            assert page.locator("#replay-done").inner_text() == "Replayed: 10 entries."
        finally:
            browser.close()

    # AND the ten of that host are due afresh, the acked and the other host's untouched
    mine = [store.get(i) for i in failed if store.get(i).recipient.startswith(
        "https://hooks.example:8443/")]
    assert len(mine) == 10
    assert {(e.status, e.attempts) for e in mine} == {(DeliveryStatus.PENDING, 0)}
    assert {store.get(i).status for i in acked} == {DeliveryStatus.ACKED}
    [other] = [i for i in failed if store.get(i).recipient == "https://other.example/in"]
    assert store.get(other).status is DeliveryStatus.FAILED
    [row] = [r for r in RunStore(services.db).recent_audit()
             if r["action"] == "delivery:replay"]
    assert row["actor"] == "local-dev", row
    assert (row["detail"]["count"], row["detail"]["filter"]["destination"]) == (10, DESTINATION)
