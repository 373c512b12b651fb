"""state-cleanup as the reference documents describe it, through the HTTP app: an expired
state row is invisible to reads but stays until the cleanup's cron ``GET`` deletes it, and
threshold-firing hash rows go after 90 days, the others stay."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import time_machine
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.http.app import create_app
from sluice.ops.access import create_login_nonce
from tests.conftest import CRON_SECRET

CLEANUP = "/api/admin/state/cleanup"
CRON = {"authorization": f"Bearer {CRON_SECRET}"}


def state_rows(services: Services, table: str = "platform_state") -> list[str]:
    with services.db.transaction() as tx:
        return [r["key"] for r in tx.fetchall(f"SELECT key FROM {table} ORDER BY key", {})]


def test_an_expired_row_is_invisible_and_stays_until_the_cleanup_deletes_it(
        db_url: str, make_services: Callable[..., Services]) -> None:
    """A console login link (a state row with an expiry), expired: redeeming it is refused as
    if it did not exist, its row is still there, and the cleanup deletes exactly it."""
    services = make_services(db_url)
    client = TestClient(create_app(services))
    start = datetime.now(UTC)
    with time_machine.travel(start, tick=True):
        nonce = create_login_nonce(services.settings, services.state, ["ops"],
                                   ttl=timedelta(minutes=5))
        live = create_login_nonce(services.settings, services.state, ["ops"],
                                  ttl=timedelta(hours=1))
    [expired_key] = [k for k in state_rows(services)
                     if services.state.get(k, now=start) is not None
                     and services.state.get(k, now=start + timedelta(minutes=10)) is None]
    with time_machine.travel(start + timedelta(minutes=10), tick=True):
        refused = client.get(f"/admin/login?nonce={nonce}", follow_redirects=False)
        assert refused.status_code == 401
        assert expired_key in state_rows(services), "read as absent, not deleted"
        cleaned = client.get(CLEANUP, headers=CRON).json()
        assert cleaned["deleted"] == 1
        assert expired_key not in state_rows(services) and len(state_rows(services)) == 1
        assert client.get(f"/admin/login?nonce={live}",
                          follow_redirects=False).status_code == 303


def test_threshold_firings_older_than_90_days_are_deleted_and_nothing_else(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(db_url)
    now = datetime.now(UTC)
    rows = {"platform:ai-envelope-threshold-firings:t1": now - timedelta(days=91),
            "platform:ai-envelope-threshold-firings:t2": now - timedelta(days=89),
            "platform:other-firings:t1": now - timedelta(days=400)}
    with services.db.transaction() as tx:
        for key, at in rows.items():
            tx.execute("INSERT INTO platform_state_hash (key, field, value, updated_at) "
                       "VALUES (:key, 'f', :value, :at)", {"key": key, "value": tx.json(1),
                                                           "at": at})
    body = TestClient(create_app(services)).get(CLEANUP, headers=CRON).json()
    assert body["deletedHashRecords"] == 1
    assert state_rows(services, "platform_state_hash") == [
        "platform:ai-envelope-threshold-firings:t2", "platform:other-firings:t1"]
