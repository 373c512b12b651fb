"""The two AI usage jobs over HTTP: cron GET with the bearer, admin POST for billing."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

from sluice.billing.usage import insert_entries
from sluice.core.services import Services
from sluice.http.app import create_app
from sluice.store.redis_clients import LEDGER_RETRY_QUEUE, RedisClient
from tests.conftest import CRON_SECRET, admin_token
from tests.integration.billing.usage_data import entry, envelope
from tests.providers.polar import PolarStandIn

CRON = {"authorization": f"Bearer {CRON_SECRET}"}


def test_ledger_redrive_routes(make_services: Callable[..., Services], pg_url: str,
                               redis_env: dict[str, str], redis_client: RedisClient) -> None:
    services = make_services(pg_url, **redis_env)
    client = TestClient(create_app(services), raise_server_exceptions=False)
    redis_client.lpush(LEDGER_RETRY_QUEUE, *[envelope(i) for i in range(130)])
    route = "/api/admin/ai/ledger/retry/flush"

    assert client.get(route).status_code == 401
    answer = client.get(route, headers=CRON)
    assert answer.status_code == 200 and answer.json()["succeeded"] == 130, "pages to the end"
    redis_client.lpush(LEDGER_RETRY_QUEUE, *[envelope(i) for i in range(200, 330)])
    ops = {"authorization": f"Bearer {admin_token(['ops'])}"}
    assert client.post(route, headers=ops).status_code == 403
    billing = {"authorization": f"Bearer {admin_token(['billing'])}"}
    answer = client.post(f"{route}?batches=1", headers=billing)
    assert answer.status_code == 200
    assert answer.json() == {"drained": 100, "succeeded": 100, "requeued": 0, "deadLettered": 0,
                             "erased": 0, "errors": [], "reason": None}
    services.redis.close()


def test_metering_flush_routes(make_services: Callable[..., Services], sqlite_url: str,
                               polar: PolarStandIn) -> None:
    services = make_services(sqlite_url, POLAR_ACCESS_TOKEN=polar.token, POLAR_API_URL=polar.url)
    insert_entries(services.db, [entry(i) for i in range(3)])
    client = TestClient(create_app(services), raise_server_exceptions=False)
    route = "/api/admin/ai/metering/flush"
    answer = client.get(route, headers=CRON)
    assert answer.status_code == 200
    assert answer.json() == {"processed": 3, "failed": 0, "skipped": 0, "reason": None}
    billing = {"authorization": f"Bearer {admin_token(['billing'])}"}
    assert client.post(route, headers=billing).json()["processed"] == 0
    assert len(polar.events) == 3
