"""Every timestamp in every JSON payload has one form: UTC, milliseconds, ``Z``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.delivery.store import DeliveryStore
from sluice.erasure.requests import ErasureStore
from sluice.http.app import create_app
from sluice.queues.deadletters import LocalDeadLetters
from tests.conftest import BASE_ENV, CRON_SECRET, REDIS_URL, admin_token, run_cli

LOOKS_LIKE_TIME = re.compile(r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d")
ONE_FORM = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _times(value: Any) -> list[str]:
    return [s for s in _strings(value) if LOOKS_LIKE_TIME.match(s)]


def root() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['super_admin'])}"}


def test_api_and_cli_payloads_format_every_timestamp_alike(
        db_url: str, redis_prefix: str, make_services: Callable[..., Services]) -> None:
    services = make_services(db_url, SLUICE_REDIS_URL=REDIS_URL,
                             SLUICE_REDIS_KEY_PREFIX=redis_prefix)
    DeliveryStore(services.db).enqueue("webhook", "https://hooks.example/a", {"text": "one"})
    ErasureStore(services.db).create("user-7", requested_by="op", grace_days=0)
    LocalDeadLetters(services.db).add("rss.enrich", {"originalMessageId": "m1",
                                                     "errorMessage": "not implemented"})
    client = TestClient(create_app(services))
    bodies = [client.get("/api/admin/state/cleanup",
                         headers={"authorization": f"Bearer {CRON_SECRET}"}).json()]
    for path in ("/api/admin/jobs", "/api/admin/queues", "/api/admin/erasure/requests",
                 "/api/admin/delivery/entries", "/api/admin/delivery/stats",
                 "/api/admin/dlq/rss.enrich"):
        answer = client.get(path, headers=root())
        assert answer.status_code == 200, (path, answer.text)
        bodies.append(answer.json())
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": db_url}
    for command in (["jobs", "--json"], ["delivery", "list", "--json"],
                    ["erasure", "list", "--json"]):
        done = run_cli(command, env)
        assert done.returncode == 0, done.stderr
        bodies.append(json.loads(done.stdout))
    found = [t for body in bodies for t in _times(body)]
    assert len(found) >= 10, found
    assert [t for t in found if not ONE_FORM.match(t)] == []
