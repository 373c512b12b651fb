"""The deliveries page's destination actions in a real browser (Playwright driving Debian's
Chromium): replay a destination's window (the dry run's preview first, then the confirmed
run and its one audit row), and steer a destination (pause, resume, disable, enable, each
previewed then confirmed and audited) while real drains send to a local webhook receiver.
The oracles are what the receiver got, the store's rows and the audit trail."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from sluice.core.services import Services
from sluice.core.times import iso_z
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.jobs.runs import RunStore
from sluice.store.db import utcnow
from tests.e2e.console.test_console_browser import (
    SHOTS,
    _check_accessibility,
    logged_in,
    serving,
)
from tests.integration.delivery.helpers import WEBHOOK_SECRET, drain_once
from tests.providers.webhook import WebhookReceiver

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
    base, services = served
    since = iso_z(utcnow() - timedelta(hours=1))
    failed, acked = _seed(services)
    store = DeliveryStore(services.db)
    with logged_in(base, services) as page:
        page.goto(f"{base}/admin/deliveries")
        page.get_by_label("Destination to replay").fill(DESTINATION)
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


@pytest.fixture
def hooked(sqlite_url: str, make_services: Any
           ) -> Iterator[tuple[str, Services, WebhookReceiver]]:
    """The console, and drains that send to a local webhook receiver."""
    with WebhookReceiver(WEBHOOK_SECRET) as receiver:
        services: Services = make_services(
            sqlite_url, SLUICE_WEBHOOK_SIGNING_SECRET=WEBHOOK_SECRET,
            SLUICE_WEBHOOK_ALLOW_HOSTS="127.0.0.1", SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS="5")
        with serving(services) as base:
            yield base, services, receiver


def _change(page: Any, key: str, action: str, **fields: str) -> str:
    """From the destinations table: the action's inputs, its preview, then the confirm;
    the preview's effect in words."""
    page.goto(page.url.split("/admin/")[0] + "/admin/deliveries")
    page.get_by_label(f"{action.capitalize()} {key}").click()
    for label, value in fields.items():
        page.get_by_label(label.capitalize()).fill(value)
    if fields:
        page.get_by_role("button", name=f"Preview {action}…").click()
    effect = page.locator("#change-effect").inner_text()
    page.get_by_role("button", name=f"Confirm {action}").click()
    page.wait_for_selector("#change-done")
    return effect


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pause_resume_disable_and_enable_a_destination_from_the_console(
        hooked: tuple[str, Services, WebhookReceiver]) -> None:
    base, services, receiver = hooked
    store = DeliveryStore(services.db)
    store.enqueue("webhook", f"{receiver.url}/first", {"text": "first"})
    assert drain_once(services)["recovered"] == 1
    # the receiver (the host and port every URL below shares), as the destinations table
    # lists it
    key = store.list(limit=1)[0].receiver
    assert key is not None and key.startswith("webhook:127.0.0.1:")
    audit = lambda action: [r for r in RunStore(services.db).recent_audit()
                            if r["action"] == f"delivery:destination_{action}"]
    # two more wait for it (the page lists an ok receiver while it has entries waiting)
    waiting = [store.enqueue("webhook", f"{receiver.url}/w{n}", {"text": f"w{n}"})[0]
               for n in range(2)]
    with logged_in(base, services) as page:
        page.goto(f"{base}/admin/deliveries")
        row = page.locator(f"#destinations tr[data-destination='{key}']")
        assert row.locator("[data-state]").inner_text() == "ok"
        _check_accessibility(page, "/admin/deliveries")
        page.get_by_label(f"Pause {key}").click()
        page.wait_for_url(re.compile(r"/admin/deliveries/destinations/pause\?"))
        page.wait_for_selector("h1")
        _check_accessibility(page, "/admin/deliveries/destinations/pause")

        # Pause for an hour: the preview says what waits; nothing goes out meanwhile
        until = iso_z(utcnow() + timedelta(hours=1))
        effect = _change(page, key, "pause", until=until, reason="receiver maintenance")
        assert "wait until" in effect and "no attempt counted" in effect, effect
        [paused] = audit("pause")
        assert paused["actor"] == "local-dev" and paused["detail"]["change"]["until"] == until
        assert paused["detail"]["change"]["reason"] == "receiver maintenance"
        sent = len(receiver.received)
        drain_once(services)
        assert len(receiver.received) == sent, "nothing is sent while paused"
        assert {(store.get(e.id).status, store.get(e.id).attempts) for e in waiting} == {
            (DeliveryStatus.PENDING, 0)}
        page.goto(f"{base}/admin/deliveries")
        assert row.locator("[data-state]").inner_text() == "paused"
        page.screenshot(path=str(SHOTS / "deliveries_destinations.png"), full_page=True)

        # Resume: the two go out, once each
        effect = _change(page, key, "resume")
        assert "due at once" in effect, effect
        assert drain_once(services)["recovered"] == 2
        assert sorted(r["body"]["text"] for r in receiver.received[sent:]) == ["w0", "w1"]

        # Disable (an entry waiting again lists it): the waiting one fails at once, a later
        # one at the next drain, each destination_disabled without a request
        waiting_one, _ = store.enqueue("webhook", f"{receiver.url}/waiting", {"text": "waiting"})
        _change(page, key, "disable", reason="customer offboarded")
        later, _ = store.enqueue("webhook", f"{receiver.url}/later", {"text": "later"})
        sent = len(receiver.received)
        drain_once(services)
        assert len(receiver.received) == sent
        for entry in (waiting_one, later):
            failed = store.get(entry.id)
            assert (failed.status, failed.failure_reason, failed.attempts) == (
                DeliveryStatus.FAILED, "destination_disabled", 0)
        page.goto(f"{base}/admin/deliveries")
        assert row.locator("[data-state]").inner_text() == "disabled"
        assert "customer offboarded" in row.inner_text()

        # Enable, then redrive what the disable failed (the destination filter's
        # redrive-all): delivered once
        _change(page, key, "enable")
        page.goto(f"{base}/admin/deliveries?destination={key}&status=failed")
        page.get_by_role("button", name=re.compile("Redrive every failed entry to")).click()
        page.get_by_role("button", name="Confirm redrive").click()
        page.wait_for_selector("text=Redrive: 2 entries.")
        assert drain_once(services)["recovered"] == 2
        assert sorted(r["body"]["text"] for r in receiver.received[sent:]) == [
            "later", "waiting"]
    assert [len(audit(a)) for a in ("pause", "resume", "disable", "enable")] == [1, 1, 1, 1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_entrys_page_says_why_it_waits(served: tuple[str, Services]) -> None:
    """From the list to one entry's page: the sentence ``sluice delivery why`` prints, what
    holds it (a link to its destination's entries) and until when."""
    from sluice.delivery.why import why
    from sluice.ops.destinations import apply, parse_change

    base, services = served
    entry, _ = DeliveryStore(services.db).enqueue("webhook", "https://hooks.example:8443/in/w",
                                                  {"text": "waits"})
    until = utcnow() + timedelta(hours=2)
    apply(services, parse_change("pause", DESTINATION, {"until": iso_z(until)}))
    answer = why(services, entry.id)
    with logged_in(base, services) as page:
        page.goto(f"{base}/admin/deliveries")
        page.get_by_role("link", name=entry.id).click()
        page.wait_for_url(f"{base}/admin/deliveries/entries/{entry.id}")
        assert page.locator("#why").inner_text() == answer.sentence
        assert page.locator("#why").get_attribute("data-kind") == "paused"
        assert answer.sentence.startswith(f"Paused by an operator until {iso_z(until)}")
        held = page.get_by_role("link", name=DESTINATION)
        assert held.get_attribute("href") == "/admin/deliveries?destination=" + \
            DESTINATION.replace(":", "%3A")
        _check_accessibility(page, "/admin/deliveries/entries/ID")
        page.screenshot(path=str(SHOTS / "delivery-entry-why.png"), full_page=True)
