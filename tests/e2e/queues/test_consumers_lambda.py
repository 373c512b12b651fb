"""The consumer Lambda entry points, called in process with event JSON from tests/events/."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType

import pytest

from sluice.core.services import Services
from sluice.queues.deadletters import Quarantine
from sluice.queues.handlers import register_catalog_refresh
from sluice.queues.keys import CompletedKeys, dedupe_key
from sluice.queues.signing import MissingSecret, Signer
from sluice.store.flags import FlagStore
from tests.conftest import BASE_ENV, ROOT, load_event

SECRET = "queue-secret-for-tests-0123456789"


def consumers_module(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                     topic: str = "rss.ingest") -> ModuleType:
    monkeypatch.setenv("SLUICE_TOPIC", topic)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    sys.modules.pop("functions.consumers", None)
    sys.modules.pop("sluice.lambda_handlers.consumers", None)
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
    register_catalog_refresh(lambda services, message: refreshed.append(services))
    try:
        event = load_event("sqs_rss_ingest")
        assert module.handler(event, None) == {"batchItemFailures": []}
        assert refreshed == [module.SERVICES]
        key = dedupe_key("rss.ingest", json.loads(event["Records"][0]["body"]))
        assert CompletedKeys(services.db).done(key)
        assert module.handler(event, None) == {"batchItemFailures": []}  # a duplicate delivery
        assert len(refreshed) == 1
        forged = load_event("sqs_rss_ingest_forged")
        assert module.handler(forged, None) == {"batchItemFailures": []}
        assert len(refreshed) == 1
        [kept] = Quarantine(services.db).list(10)  # acknowledged, but kept
        assert kept["id"] == forged["Records"][0]["messageId"]
        assert kept["reason"] == "signature does not match"
    finally:
        register_catalog_refresh(None)


def test_ingest_acknowledges_without_work_when_the_flag_is_off(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    module = consumers_module(monkeypatch, env)
    refreshed: list[Services] = []
    register_catalog_refresh(lambda services, message: refreshed.append(services))
    try:
        assert module.handler(load_event("sqs_rss_ingest"), None) == {"batchItemFailures": []}
        assert refreshed == []
    finally:
        register_catalog_refresh(None)


def test_a_reserved_topic_function_fails_loud(env: dict[str, str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    module = consumers_module(monkeypatch, env, "rss.cluster")
    event = load_event("sqs_rss_ingest")
    message = json.loads(event["Records"][0]["body"])
    event["Records"][0]["body"] = json.dumps(Signer([SECRET]).sign({**message,
                                                                    "topic": "rss.cluster"}))
    event["Records"][0]["attributes"]["ApproximateReceiveCount"] = "5"
    del event["Records"][0]["messageAttributes"]["idempotencyKey"]
    # The last attempt: the -dlq send is tried (the in-process DLQ here) and only then acked.
    assert module.handler(event, None) == {"batchItemFailures": []}
    from sluice.ops.deadletters import DeadLetters

    [item] = DeadLetters(module.SERVICES).list_letters("rss.cluster")["items"]
    assert "rss.cluster consumer is not implemented" in item["reason"]


def test_a_consumer_function_without_its_signing_secret_fails_at_cold_start(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLUICE_QUEUE_SIGNING_SECRET", raising=False)
    unsigned = {k: v for k, v in env.items() if k != "SLUICE_QUEUE_SIGNING_SECRET"}
    with pytest.raises(MissingSecret, match="rss.ingest consumer refuses to start"):
        consumers_module(monkeypatch, unsigned)


def test_the_consumer_module_does_not_import_fastapi(db_url: str) -> None:
    code = ("import sys, functions.consumers; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('fastapi', 'starlette', 'mangum', 'uvicorn')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", **BASE_ENV, "SLUICE_DATABASE_URL": db_url,
                               "SLUICE_TOPIC": "rss.ingest", "SLUICE_QUEUE_SIGNING_SECRET": SECRET})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
