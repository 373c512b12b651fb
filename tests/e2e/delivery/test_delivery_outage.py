"""A tenant webhook down (nothing answers at its address) for 30 simulated minutes with one
alert queued: nothing fails, a drain every minute probes it only at each backoff step, the
status endpoint, the console (overview card and deliveries page) show the receiver down with
its waiting entry, and the alert is delivered once when the receiver is back. Time passes by
moving the rows' timestamps back, never by sleeping. (A receiver that answers, say 503, to
a lone entry is answering it: that is the entry's own failure, counted on the schedule;
tests/integration/delivery/test_delivery_channels.py.)"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.delivery import drain
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.http.app import create_app
from tests.conftest import CRON_SECRET, admin_token, free_port
from tests.providers.webhook import WebhookReceiver

SECRET = "webhook-secret-for-tests-0123456789"


@pytest.fixture
def svc(db_url: str, make_services: Callable[..., Services]) -> Services:
    # the host's rate wide: a minute passes here in a moment of real time, and a probe set
    # aside for a rate slot (a real-time wait) would skip the minutes this test counts
    return make_services(db_url, SLUICE_WEBHOOK_SIGNING_SECRET=SECRET,
                         SLUICE_WEBHOOK_HOST_RATE_PER_SECOND="10000")


def minute_passes(svc: Services) -> None:
    d = timedelta(minutes=1)
    with svc.db.transaction() as tx:
        for row in tx.fetchall("SELECT id, next_attempt_at, enqueued_at, updated_at "
                               "FROM delivery_queue"):
            tx.execute("UPDATE delivery_queue SET next_attempt_at = :n, enqueued_at = :e, "
                       "updated_at = :u WHERE id = :id",
                       {"id": row["id"], "n": row["next_attempt_at"] - d,
                        "e": row["enqueued_at"] - d, "u": row["updated_at"] - d})
        for row in tx.fetchall("SELECT key, next_probe_at, down_since "
                               "FROM delivery_destinations"):
            tx.execute("UPDATE delivery_destinations SET next_probe_at = :n, down_since = :s "
                       "WHERE key = :key", {"key": row["key"], "n": _earlier(row["next_probe_at"], d),
                                            "s": _earlier(row["down_since"], d)})


def _earlier(moment: datetime | None, by: timedelta) -> datetime | None:
    """A destination that is up keeps its row, without a probe or a failure time."""
    return None if moment is None else moment - by


def test_a_webhook_down_for_30_minutes_fails_nothing_and_is_shown_down(
        svc: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drain, "SLEEP", lambda seconds: None)  # in-process retry waits
    client = TestClient(create_app(svc), raise_server_exceptions=False)
    cron = {"authorization": f"Bearer {CRON_SECRET}"}
    store = DeliveryStore(svc.db)
    port = free_port()  # nobody listens there yet: every connection is refused
    entry, _ = store.enqueue("webhook", f"http://127.0.0.1:{port}{WebhookReceiver.PATH}",
                             {"text": "breach"}, idempotency_key="alert:down:1")

    results = []
    for _ in range(30):
        drained = client.get("/api/admin/delivery/drain", headers=cron)
        assert drained.status_code == 200
        results.append(drained.json())
        minute_passes(svc)

    assert sum(r["failed"] + r["skippedMaxRetries"] for r in results) == 0
    waiting = store.get(entry.id)
    assert (waiting.status, waiting.attempts, waiting.held_by) == (
        DeliveryStatus.PENDING, 0, None), "the receiver's failure: no attempt counted"

    status = client.get("/api/queue/status", headers=cron).json()
    [down] = status["destinations"]
    assert down["down"] and down["waiting"] == 1 and down["key"] == f"webhook:127.0.0.1:{port}"
    # each failed probe is one failure of the receiver: one per backoff step, not a minute
    assert 4 <= down["failures"] <= 8, down
    admin = {"authorization": f"Bearer {admin_token(['ops', 'super_admin'])}"}
    overview = client.get("/api/admin/console/overview", headers=admin).json()
    [card] = [c for c in overview["cards"] if c["key"] == "delivery"]
    assert any("is down since" in alert and "1 entries waiting" in alert
               for alert in card["alerts"])
    page = client.get("/api/admin/console/deliveries", headers=admin).json()
    assert [d["key"] for d in page["destinations"]] == [down["key"]]

    # WHEN the receiver comes back at its address, the next probe delivers it, once
    with WebhookReceiver(SECRET, port=port) as receiver:
        for _ in range(11):
            client.get("/api/admin/delivery/drain", headers=cron)
            minute_passes(svc)
    stored = store.get(entry.id)
    assert stored.status is DeliveryStatus.ACKED and stored.attempts == 1
    assert list(receiver.delivered) == ["alert:down:1"] and len(receiver.received) == 1
    assert client.get("/api/queue/status", headers=cron).json()["destinations"] == []
