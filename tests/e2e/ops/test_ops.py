"""The operations surface shows measured figures, never literals."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import boto3
import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.delivery.store import DeliveryStore
from sluice.erasure.requests import ErasureStore
from sluice.http.app import create_app
from sluice.jobs.registry import get_job
from sluice.jobs.runner import run_job
from sluice.ops.overview import queue_figures
from sluice.queues.deadletters import LocalDeadLetters
from sluice.queues.topics import dlq_name, queue_name
from sluice.store.db import utcnow
from sluice.store.redis_clients import LEDGER_RETRY_DLQ, LEDGER_RETRY_PROCESSING, LEDGER_RETRY_QUEUE
from tests.conftest import REDIS_URL, admin_token


def ops() -> dict[str, str]:
    """Minted per request: a token minted at import expires on a slow run."""
    return {"authorization": f"Bearer {admin_token(['ops'])}"}


def _seed(services: Services) -> None:
    now = utcnow()
    with services.db.transaction() as tx:
        tx.executemany(
            "INSERT INTO ai_usage_metering_outbox (id, ledger_id, external_customer_id, "
            "event_name, metadata, status, attempt_count, created_at) "
            "VALUES (:id, :id, 'cust', 'ai_usage', '{}', :status, :attempts, :created)",
            [{"id": "o1", "status": "pending", "attempts": 0, "created": now - timedelta(hours=2)},
             {"id": "o2", "status": "pending", "attempts": 0, "created": now},
             {"id": "o3", "status": "failed", "attempts": 2, "created": now},
             {"id": "o4", "status": "failed", "attempts": 5, "created": now},
             {"id": "o5", "status": "processed", "attempts": 1, "created": now}])
    store = DeliveryStore(services.db)
    store.enqueue("webhook", "https://hooks.example/a", {"text": "one"})
    store.enqueue("webhook", "https://hooks.example/b", {"text": "two"})
    ErasureStore(services.db).create("user-7", requested_by="op", grace_days=0)
    ErasureStore(services.db).create("user-8", requested_by="op", grace_days=7)
    LocalDeadLetters(services.db).add("rss.enrich", {"originalMessageId": "m1",
                                                     "errorMessage": "not implemented"})
    redis = services.redis
    redis.rpush(LEDGER_RETRY_QUEUE, "a", "b", "c")
    redis.rpush(LEDGER_RETRY_PROCESSING, "d")
    redis.rpush(LEDGER_RETRY_DLQ, "e", "f")
    run_job(get_job("state-cleanup"), services, "cli")


def test_local_figures_are_measured(db_url: str, redis_prefix: str, make_services: Any) -> None:
    services = make_services(db_url, SLUICE_REDIS_URL=REDIS_URL, SLUICE_REDIS_KEY_PREFIX=redis_prefix)
    _seed(services)
    client = TestClient(create_app(services))
    data = client.get("/api/admin/queues", headers=ops()).json()
    assert data["meteringOutbox"]["pending"] == 2
    assert data["meteringOutbox"]["retrying"] == 1
    assert data["meteringOutbox"]["exhausted"] == 1
    assert data["meteringOutbox"]["processed"] == 1
    assert data["ledgerRetry"] == {"queue": 3, "processing": 1, "dlq": 2}
    assert data["delivery"]["pending"]["count"] == 2
    assert data["erasure"]["due"] == 1 and data["erasure"]["byStatus"]["requested"] == 2
    dlq = {t["topic"]: t["dlq"]["depth"] for t in data["topics"]}
    assert dlq == {"rss.ingest": 0, "rss.enrich": 1, "rss.cluster": 0, "rss.synthesize": 0}
    [cleanup] = [j for j in data["jobs"] if j["job"] == "state-cleanup"]
    assert cleanup["lastRun"]["outcome"] == "ok" and cleanup["lastRun"]["trigger"] == "cli"

    page = client.get("/admin/queues", headers={"cookie": f"__session={admin_token(['ops'])}"})
    assert page.status_code == 200 and "Queue health" in page.text
    assert 'data-card="rss.enrich-dlq"' in page.text


def test_the_page_is_restricted(sqlite_url: str, make_services: Any) -> None:
    client = TestClient(create_app(make_services(sqlite_url)))
    assert client.get("/admin/queues").status_code == 401
    denied = client.get("/admin/queues",
                        headers={"cookie": f"__session={admin_token(['billing'])}"})
    assert denied.status_code == 403 and "Queue monitoring access is restricted" in denied.text
    assert client.get("/api/admin/queues").status_code == 401
    for role in ("ops", "super_admin"):  # the queues surface's two roles
        allowed = client.get("/admin/queues", headers={"cookie": f"__session={admin_token([role])}"})
        assert allowed.status_code == 200 and "Queue health" in allowed.text, role


def test_a_broken_store_shows_in_its_own_section(sqlite_url: str, make_services: Any) -> None:
    services = make_services(sqlite_url, SLUICE_REDIS_URL="redis://127.0.0.1:1/0")
    data = queue_figures(services)
    assert "error" in data["ledgerRetry"]
    assert data["delivery"]["pending"]["count"] == 0, "the other sections still answer"
    assert data["quarantine"] == {"depth": 0}


def test_sqs_figures_come_from_sqs_and_cloudwatch(sqlite_url: str, make_services: Any,
                                                  aws_env: dict[str, str]) -> None:
    prefix = "sluice-opstest-"
    sqs = boto3.client("sqs")
    urls = {}
    for topic in ("rss.ingest", "rss.enrich", "rss.cluster", "rss.synthesize"):
        urls[topic] = sqs.create_queue(QueueName=queue_name(prefix, topic))["QueueUrl"]
        urls[topic + "-dlq"] = sqs.create_queue(QueueName=dlq_name(prefix, topic))["QueueUrl"]
    for n in range(3):
        sqs.send_message(QueueUrl=urls["rss.ingest"], MessageBody=json.dumps({"n": n}))
    sqs.send_message(QueueUrl=urls["rss.ingest"], MessageBody="later", DelaySeconds=60)
    sqs.send_message(QueueUrl=urls["rss.ingest-dlq"], MessageBody="dead")
    sqs.receive_message(QueueUrl=urls["rss.ingest"], MaxNumberOfMessages=1, VisibilityTimeout=60)
    cloudwatch = boto3.client("cloudwatch")
    cloudwatch.put_metric_data(Namespace="AWS/SQS", MetricData=[{
        "MetricName": "ApproximateAgeOfOldestMessage", "Value": 42.0, "Unit": "Seconds",
        "Timestamp": utcnow() - timedelta(minutes=1),
        "Dimensions": [{"Name": "QueueName", "Value": queue_name(prefix, "rss.ingest")}]}])

    services = make_services(sqlite_url, SLUICE_QUEUE_MODE="sqs", SLUICE_QUEUE_PREFIX=prefix,
                             SLUICE_QUEUE_SIGNING_SECRET="signing-secret-0123456789")
    [ingest, *_] = queue_figures(services)["topics"]
    assert ingest["queue"]["visible"] == 2
    assert ingest["queue"]["inFlight"] == 1
    assert ingest["queue"]["delayed"] == 1
    assert ingest["queue"]["oldestAgeS"] == pytest.approx(42.0)
    assert ingest["dlq"]["visible"] == 1 and ingest["dlq"]["oldestAgeS"] is None
