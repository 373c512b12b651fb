"""The public API goes through the door: each bad input is refused by ``sluice.*``, by the
HTTP API and by the command line with the same error naming the same field (the door's one
table), and nothing is stored; ``sluice.connect()`` never creates a database."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import sluice
from sluice.core.services import Services
from sluice.delivery.store import DeliveryStore
from sluice.erasure.requests import ErasureStore
from sluice.http.app import create_app
from sluice.ops.door import OPERATIONS, Field, body_fields
from tests.conftest import BASE_ENV, ROOT, admin_token, run_cli

# (channel, recipient, payload, key, user) -> the field refused
DELIVERIES = [
    (("webhook", "not a url", {"text": "hi"}, None, None), "recipient"),
    (("webhook", "https://hooks.example.com/a\r\nX-Evil: 1", {"text": "hi"}, None, None),
     "recipient"),
    (("webhook", "http://10.0.0.7/hook", {"text": "hi"}, None, None), "recipient"),
    (("telegram", "12ab", {"text": "hi"}, None, None), "recipient"),
    (("email", "a b@c", {"text": "hi"}, None, None), "recipient"),
    (("slack", "C0ALERTS", {"text": "hi", "bogus": 1}, None, None), "bogus"),
    (("slack", "C0ALERTS", {"text": "hi"}, "has space", None), "idempotencyKey"),
    (("slack", "C0ALERTS", {"text": "hi"}, None, "u\n1"), "subjectUserId"),
]
# (subject, tenant, grace days) -> the field refused
ERASURES = [
    (("a b", None, None), "subjectUserId"),
    (("u-1", "t\n1", None), "tenantId"),
    (("u-1", None, 400), "graceDays"),
]


def _python(call: Callable[[], Any]) -> tuple[str, str]:
    with pytest.raises(sluice.RequestError) as caught:
        call()
    return caught.value.context["field"], caught.value.message


def _http(answer: Any) -> tuple[str, str]:
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    return error["field"], error["message"]


def _cli(done: Any) -> str:
    assert done.returncode == 64, (done.returncode, done.stderr)
    line = done.stderr.strip().splitlines()[-1]
    code, _, message = line.removeprefix("sluice: ").partition(": ")
    assert code in ("bad_request", "address_refused"), line
    return message


@pytest.fixture
def door(sqlite_url: str, make_services: Callable[..., Services]
         ) -> tuple[Services, TestClient, dict[str, str]]:
    services = make_services(sqlite_url)
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": sqlite_url}
    return services, TestClient(create_app(services), raise_server_exceptions=False), env


def test_a_bad_delivery_is_refused_alike_by_python_http_and_the_cli(
        door: tuple[Services, TestClient, dict[str, str]]) -> None:
    services, client, env = door
    headers = {"authorization": f"Bearer {admin_token(['ops'])}"}
    for (channel, recipient, payload, key, user), field in DELIVERIES:
        python = _python(partial(sluice.enqueue_delivery, services, channel, recipient, payload,
                                 idempotency_key=key, subject_user_id=user))
        body = {"channel": channel, "recipient": recipient, "payload": payload,
                "idempotencyKey": key, "subjectUserId": user}
        http = _http(client.post("/api/admin/delivery/entries", headers=headers,
                                 json={k: v for k, v in body.items() if v is not None}))
        args = ["delivery", "enqueue", channel, recipient, "--payload", json.dumps(payload)]
        args += ["--key", key] if key is not None else []
        args += ["--user", user] if user is not None else []
        cli = _cli(run_cli(args, env))
        assert python[0] == field and python == http, (recipient, python, http)
        assert cli == python[1], (recipient, cli, python)
    assert DeliveryStore(services.db).list(status=None, channel=None, limit=10) == []


def test_a_bad_erasure_request_is_refused_alike_by_python_http_and_the_cli(
        door: tuple[Services, TestClient, dict[str, str]]) -> None:
    services, client, env = door
    headers = {"authorization": f"Bearer {admin_token(['privacy'])}"}
    for (subject, tenant, grace), field in ERASURES:
        python = _python(partial(sluice.request_erasure, services, subject,
                                 requested_by="app:test", tenant_id=tenant, grace_days=grace))
        body = {"subjectUserId": subject, "tenantId": tenant, "graceDays": grace}
        http = _http(client.post("/api/admin/erasure/requests", headers=headers,
                                 json={k: v for k, v in body.items() if v is not None}))
        args = ["erasure", "request", subject]
        args += ["--tenant", tenant] if tenant is not None else []
        args += ["--grace-days", str(grace)] if grace is not None else []
        cli = _cli(run_cli(args, env))
        assert python[0] == field and python == http, (subject, python, http)
        assert cli == python[1], (subject, cli, python)
    assert ErasureStore(services.db).list(status=None, limit=10) == []


def test_a_bad_publish_is_refused_alike_by_python_and_the_cli(
        door: tuple[Services, TestClient, dict[str, str]]) -> None:
    services, _, env = door
    deep: Any = "x"
    for _ in range(100):
        deep = [deep]
    for topic, fields, field in (("no.such.topic", {}, "topic"),
                                 ("rss.enrich", {}, "topic"),
                                 ("rss.ingest", {"sourceId": deep}, "fields"),
                                 ("rss.ingest", {"note": "x" * 300_000}, "fields")):
        python = _python(partial(sluice.publish, services, topic, fields))
        cli = run_cli(["publish", topic], env, stdin=json.dumps(fields))
        assert cli.returncode == 64, cli.stderr
        assert python[0] == field and python[1] in cli.stderr, (topic, python, cli.stderr)


def test_every_http_body_field_is_a_row_of_the_door_table() -> None:
    """The OpenAPI bodies and the door's table name the same fields (one table)."""
    from sluice.http.models import DeliveryRequest, ErasureRequestBody

    assert tuple(DeliveryRequest.model_fields) == body_fields("enqueue_delivery")
    assert tuple(ErasureRequestBody.model_fields) == body_fields("request_erasure")
    assert set(OPERATIONS) == {"enqueue_delivery", "request_erasure", "publish"}


def test_the_guide_door_table_is_the_code() -> None:
    """docs/integration.md's table of the door is ``OPERATIONS``, row for row."""
    text = (ROOT / "docs" / "integration.md").read_text()
    rows = [[cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
            for line in text.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip() in OPERATIONS]

    def http(operation: str, item: Field) -> str:  # publish has no HTTP door
        return "" if operation == "publish" else \
            item.name if item.in_body else "(the caller's identity)"

    assert rows == [[operation, item.name, item.python, http(operation, item), item.cli]
                    for operation, table in OPERATIONS.items() for item in table]


def test_connect_never_creates_a_database(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "sluice.db"
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": f"sqlite:///{missing}"}
    with pytest.raises(sluice.ConfigurationError, match="sluice migrate"):
        sluice.connect(env)
    assert not missing.exists() and not missing.parent.exists()
    empty = tmp_path / "empty.db"
    empty.touch()
    with pytest.raises(sluice.ConfigurationError, match="run `sluice migrate`"):
        sluice.connect({**env, "SLUICE_DATABASE_URL": f"sqlite:///{empty}"})
    assert empty.stat().st_size == 0, "nothing written to it"


def test_connect_opens_a_migrated_database(sqlite_url: str) -> None:
    services = sluice.connect({**BASE_ENV, "SLUICE_DATABASE_URL": sqlite_url})
    try:
        entry = sluice.enqueue_delivery(services, "slack", "C0ALERTS", {"text": "hi"})
        assert entry.status is sluice.DeliveryStatus.PENDING
    finally:
        services.close()


def test_the_webhook_verifier_is_public_and_reads_headers_in_any_case() -> None:
    from sluice.core.webhooks import sign

    body, secret, now = b'{"text":"hi"}', "receiver-secret-0123456789", 1_760_000_000
    signed = {name.title(): value for name, value in sign([secret], "id-1", now, body).items()}
    assert sluice.verify_webhook(secret, signed, body, now=now)
    assert sluice.verify_webhook(secret, {k.lower(): v for k, v in signed.items()}, body,
                                 now=now)
    assert not sluice.verify_webhook(secret, signed, body + b" ", now=now)
    assert not sluice.verify_webhook(secret, signed, body, now=now + 301)
