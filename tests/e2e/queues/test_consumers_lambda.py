"""The consumer Lambda entry points, called in process with event JSON from tests/events/."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType

import pytest

from shared.core.services import Services
from shared.queues.publish import CompletedKeys
from shared.queues.signing import Signer
from shared.queues.topics import register_catalog_refresh
from shared.store.flags import FlagStore
from tests.conftest import BASE_ENV, ROOT, load_event

SECRET = "queue-secret-for-tests-0123456789"


def consumers_module(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> ModuleType:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    sys.modules.pop("functions.consumers", None)
    return importlib.import_module("functions.consumers")


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return {**BASE_ENV, "SLUICE_DATABASE_URL": db_url, "SLUICE_QUEUE_SIGNING_SECRET": SECRET}


def test_the_sample_event_is_signed_with_the_test_secret() -> None:
    body = json.loads(load_event("sqs_rss_ingest")["Records"][0]["body"])
    assert Signer([SECRET]).check(body) is None
    forged = json.loads(load_event("sqs_rss_ingest_forged")["Records"][0]["body"])
    assert Signer([SECRET]).check(forged) == "signature does not match"


def test_ingest_runs_the_refresh_once_when_the_flag_is_on(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        make_services: Callable[..., Services]) -> None:
    module = consumers_module(monkeypatch, env)
    services = make_services(env["SLUICE_DATABASE_URL"])
    FlagStore(services.state).set("rssQueuePipeline", True)
    refreshed: list[Services] = []
    register_catalog_refresh(refreshed.append)
    try:
        event = load_event("sqs_rss_ingest")
        assert module.ingest(event, None) == {"batchItemFailures": []}
        assert refreshed == [module.SERVICES]
        key = event["Records"][0]["messageAttributes"]["idempotencyKey"]["stringValue"]
        assert CompletedKeys(services.db).done(key)
        assert module.ingest(event, None) == {"batchItemFailures": []}  # a duplicate delivery
        assert len(refreshed) == 1
        assert module.ingest(load_event("sqs_rss_ingest_forged"), None) == {
            "batchItemFailures": []}
        assert len(refreshed) == 1
    finally:
        register_catalog_refresh(None)


def test_ingest_acknowledges_without_work_when_the_flag_is_off(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    module = consumers_module(monkeypatch, env)
    refreshed: list[Services] = []
    register_catalog_refresh(refreshed.append)
    try:
        assert module.ingest(load_event("sqs_rss_ingest"), None) == {"batchItemFailures": []}
        assert refreshed == []
    finally:
        register_catalog_refresh(None)


def test_a_reserved_topic_function_fails_loud(env: dict[str, str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    module = consumers_module(monkeypatch, env)
    event = load_event("sqs_rss_ingest")
    message = json.loads(event["Records"][0]["body"])
    event["Records"][0]["body"] = json.dumps(Signer([SECRET]).sign({**message,
                                                                    "topic": "rss.cluster"}))
    event["Records"][0]["attributes"]["ApproximateReceiveCount"] = "5"
    del event["Records"][0]["messageAttributes"]["idempotencyKey"]
    # The last attempt: the -dlq send is tried (the in-process DLQ here) and only then acked.
    assert module.cluster(event, None) == {"batchItemFailures": []}
    from shared.ops.deadletters import DeadLetters

    [item] = DeadLetters(module.SERVICES).list_letters("rss.cluster")["items"]
    assert "rss.cluster consumer is not implemented" in item["reason"]


def test_the_consumer_module_does_not_import_fastapi(db_url: str) -> None:
    code = ("import sys, functions.consumers; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('fastapi', 'starlette', 'mangum', 'uvicorn')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", **BASE_ENV, "SLUICE_DATABASE_URL": db_url})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
