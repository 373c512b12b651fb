"""A client generated from the API's own description works: ``openapi-python-client`` (a kept
generator) builds a Python client from ``/api/openapi.json`` served by a live local server,
and the test calls routes through it: an erasure request (``201``, then ``200`` for the
subject's open one, typed bodies both ways, the admin JWT scheme), the queue's status (the
cron bearer scheme), and a refused delivery (the typed ``400`` naming the field)."""

from __future__ import annotations

import importlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from sluice.core.services import Services
from sluice.erasure.requests import ErasureStore
from sluice.http.app import create_app
from tests.conftest import CRON_SECRET, admin_token

GENERATOR = Path(sys.executable).parent / "openapi-python-client"
PACKAGE = "sluice_generated_client"


@pytest.fixture
def live(sqlite_url: str, make_services: Any) -> Iterator[tuple[str, Services]]:
    services = make_services(sqlite_url)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(create_app(services), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", services
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture
def generated(live: tuple[str, Services], tmp_path: Path) -> Iterator[Any]:
    base, _ = live
    spec = tmp_path / "openapi.json"
    spec.write_bytes(httpx.get(f"{base}/api/openapi.json", timeout=30).content)
    config = tmp_path / "config.yml"
    config.write_text("post_hooks: []\n")  # no formatter run: the code is used as generated
    done = subprocess.run([str(GENERATOR), "generate", "--path", str(spec), "--meta", "none",
                           "--output-path", str(tmp_path / PACKAGE), "--config", str(config)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.split(".")[0] == PACKAGE]:
            del sys.modules[name]


def test_a_generated_client_calls_the_api(live: tuple[str, Services], generated: Any) -> None:
    base, services = live
    api = f"{PACKAGE}.api"
    create = importlib.import_module(
        f"{api}.erasure.erasure_create_api_admin_erasure_requests_post")
    status = importlib.import_module(f"{api}.delivery.delivery_queue_status_api_queue_status_get")
    enqueue = importlib.import_module(
        f"{api}.delivery.delivery_enqueue_api_admin_delivery_entries_post")
    models = importlib.import_module(f"{PACKAGE}.models")

    with generated.AuthenticatedClient(base_url=base, token=admin_token(["super_admin"]),
                                       raise_on_unexpected_status=True) as admin:
        opened = create.sync_detailed(client=admin, body=models.ErasureRequestBody(
            subject_user_id="u-generated", grace_days=3))
        again = create.sync_detailed(client=admin, body=models.ErasureRequestBody(
            subject_user_id="u-generated"))
        refused = enqueue.sync_detailed(client=admin, body=models.DeliveryRequest(
            channel="email", recipient="a b@c",
            payload=models.DeliveryRequestPayload.from_dict({"text": "hi"})))
    with generated.AuthenticatedClient(base_url=base, token=CRON_SECRET,
                                       raise_on_unexpected_status=True) as cron:
        health = status.sync_detailed(client=cron)
    assert opened.status_code == 201
    assert isinstance(opened.parsed, models.ErasureBody)
    assert opened.parsed.status.value == "requested"
    assert opened.parsed.requested_by == "admin-1"
    assert again.status_code == 200 and again.parsed.id == opened.parsed.id
    assert ErasureStore(services.db).get(opened.parsed.id).subject_user_id == "u-generated"
    assert health.status_code == 200 and health.parsed is not None
    assert refused.status_code == 400
    assert isinstance(refused.parsed, models.ErrorBody)
    assert refused.parsed.error.field == "recipient"


def test_the_description_declares_the_security_schemes_and_real_status_codes(
        live: tuple[str, Services]) -> None:
    base, _ = live
    doc = httpx.get(f"{base}/api/openapi.json", timeout=30).json()
    schemes = doc["components"]["securitySchemes"]
    assert schemes["adminJwt"] == {**schemes["adminJwt"], "type": "http", "scheme": "bearer",
                                   "bearerFormat": "JWT"}
    assert schemes["cronBearer"]["scheme"] == "bearer"
    create = doc["paths"]["/api/admin/erasure/requests"]["post"]
    assert {"201", "200", "400", "401", "403"} <= set(create["responses"])
    assert "422" not in create["responses"], "the door answers 400, never 422"
    assert create["security"] == [{"adminJwt": []}]
    assert create["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErasureRequestBody"}
    cron_route = doc["paths"]["/api/admin/state/cleanup"]["get"]
    assert cron_route["security"] == [{"cronBearer": []}]
    either = doc["paths"]["/api/queue/status"]["get"]["security"]
    assert sorted(either, key=str) == [{"adminJwt": []}, {"cronBearer": []}]
    flags = doc["paths"]["/api/admin/flags"]["put"]["requestBody"]
    assert flags["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/FlagChange"}
    assert "global" in doc["components"]["schemas"]["FeedSource"]["properties"]
    assert not any(path.startswith("/api/queues/") for path in doc["paths"]), \
        "the push routes are sluice dev's only"
    assert not any("x-sluice-body" in op for ops in doc["paths"].values()
                   for op in ops.values())


def test_each_described_body_lists_what_its_route_accepts() -> None:
    """The models describe; the routes check. Each model's fields are the route's own set."""
    from sluice.http.models import (
        DeadLetterPurge,
        DeadLetterRedrive,
        DeliveryRequest,
        ErasureRequestBody,
        FeedScope,
        FeedSource,
        FlagChange,
    )
    from sluice.http.queues import PURGE_FIELDS, REDRIVE_FIELDS
    from sluice.ops.door import body_fields
    from sluice.rss.admin import SCOPE_FIELDS, SOURCE_FIELDS
    from sluice.store.flags import FLAG_FIELDS

    def names(model: Any) -> set[str]:
        return {f.alias or name for name, f in model.model_fields.items()}

    assert names(DeliveryRequest) == set(body_fields("enqueue_delivery"))
    assert names(ErasureRequestBody) == set(body_fields("request_erasure"))
    assert names(FlagChange) == FLAG_FIELDS
    assert names(DeadLetterRedrive) == set(REDRIVE_FIELDS)
    assert names(DeadLetterPurge) == set(PURGE_FIELDS)
    assert names(FeedSource) == SOURCE_FIELDS
    assert names(FeedScope) == SCOPE_FIELDS
