"""The app's request path never waits on an outage longer than its bound
(``SLUICE_REQUEST_PATH_TIMEOUT_SECONDS``, 1.5 s by default): with Postgres refusing
connections, or black-holed (connections accepted, no byte answered), ``record_usage``
answers ``queued`` from the Redis retry list, and ``enqueue_delivery``, ``request_erasure``
and ``publish`` raise ``TransientStoreError``; with SQS black-holed, ``publish`` raises too.
Each is timed against the bound plus a generous margin for a busy machine (without the bound
the same calls took 10 s or more)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import pytest

import sluice
from sluice.billing.usage import RETRY_QUEUE, RetryEnvelope
from sluice.core.settings import Settings
from sluice.store.redis_clients import connect as redis_connect
from tests.conftest import BASE_ENV, free_port
from tests.tcp_proxy import StallingProxy

BOUND_S = Settings._field_defaults["request_path_timeout_s"]
# The bound, plus room for a machine shared by many test runs.
LIMIT_S = BOUND_S + 2.5
SECRET = "request-path-secret-0123456789"


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    try:
        result: Any = call()
    except sluice.SluiceError as exc:
        result = exc
    return result, time.monotonic() - started


def entry(call_id: str) -> sluice.UsageEntry:
    return sluice.UsageEntry(id=call_id, model="gpt-4.1-mini", occurred_at=datetime.now(UTC),
                             tenant_id="t-1", input_tokens=10, output_tokens=2, cost_micros=9)


@pytest.fixture
def down_env(redis_server: str, redis_prefix: str) -> dict[str, str]:
    return {**BASE_ENV, "SLUICE_REDIS_URL": redis_server, "SLUICE_REDIS_KEY_PREFIX": redis_prefix,
            "SLUICE_QUEUE_SIGNING_SECRET": SECRET}


@pytest.fixture
def black_hole(pg_url: str) -> Iterator[tuple[StallingProxy, str]]:
    """Postgres behind a proxy that can stop passing bytes (a partition)."""
    parts = urlsplit(pg_url)
    with StallingProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        yield proxy, parts._replace(netloc=f"postgres@127.0.0.1:{proxy.port}").geturl()


def every_call_within_the_bound(services: sluice.Services, tag: str) -> None:
    outcome, took = timed(lambda: sluice.record_usage(services, entry(f"call-{tag}")))
    assert outcome == "queued" and took < LIMIT_S, (outcome, took)
    parked = [RetryEnvelope.parse(r).id for r in services.redis.lrange(RETRY_QUEUE, 0, -1)]
    assert f"call-{tag}" in parked, parked
    for call in (lambda: sluice.enqueue_delivery(services, "slack", "C0ALERTS", {"text": "hi"}),
                 lambda: sluice.request_erasure(services, "u-1", requested_by="app:test"),
                 lambda: sluice.publish(services, "rss.ingest", {"sourceId": "src-1"})):
        failed, took = timed(call)
        assert isinstance(failed, sluice.TransientStoreError), failed
        assert took < LIMIT_S, took


def test_postgres_refusing_connections_costs_a_request_at_most_the_bound(
        down_env: dict[str, str]) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"  # nothing listens there
    services = sluice.connect({**down_env, "SLUICE_DATABASE_URL": url})
    try:
        every_call_within_the_bound(services, "refused")
    finally:
        services.close()


def test_postgres_black_holed_costs_a_request_at_most_the_bound(
        down_env: dict[str, str], black_hole: tuple[StallingProxy, str]) -> None:
    proxy, url = black_hole
    services = sluice.connect({**down_env, "SLUICE_DATABASE_URL": url})
    try:
        # A connection made while the network worked, kept by the pool, then stalled:
        # the wait on it is cut at the bound.
        assert sluice.record_usage(services, entry("call-before")) == "recorded"
        proxy.stall()
        every_call_within_the_bound(services, "stalled")
    finally:
        services.close()


def test_a_custom_bound_is_honoured(down_env: dict[str, str],
                                    black_hole: tuple[StallingProxy, str]) -> None:
    proxy, url = black_hole
    proxy.stall()
    services = sluice.connect({**down_env, "SLUICE_DATABASE_URL": url,
                               "SLUICE_REQUEST_PATH_TIMEOUT_SECONDS": "0.5"})
    try:
        failed, took = timed(lambda: sluice.enqueue_delivery(services, "slack", "C0ALERTS",
                                                             {"text": "hi"}))
        assert isinstance(failed, sluice.TransientStoreError) and took < 0.5 + 2.5, took
    finally:
        services.close()
    with pytest.raises(sluice.ConfigurationError, match="SLUICE_REQUEST_PATH_TIMEOUT_SECONDS"):
        sluice.connect({**down_env, "SLUICE_DATABASE_URL": url,
                        "SLUICE_REQUEST_PATH_TIMEOUT_SECONDS": "0"})


@pytest.mark.aws
def test_sqs_black_holed_costs_a_publish_at_most_the_bound(
        sqlite_url: str, aws_env: dict[str, str], moto_endpoint: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3  # type: ignore[import-untyped]

    boto3.client("sqs").create_queue(QueueName="sluice-test-rss-ingest")
    parts = urlsplit(moto_endpoint)
    with StallingProxy(parts.hostname or "127.0.0.1", parts.port or 80) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
        services = sluice.connect({**BASE_ENV, "SLUICE_DATABASE_URL": sqlite_url,
                                   "SLUICE_QUEUE_MODE": "sqs",
                                   "SLUICE_QUEUE_SIGNING_SECRET": SECRET})
        try:
            sent = sluice.publish(services, "rss.ingest", {"sourceId": "src-1"})
            assert sent.dispatched and sent.mode == "sqs"
            proxy.stall()
            failed, took = timed(lambda: sluice.publish(services, "rss.ingest",
                                                        {"sourceId": "src-2"}))
            assert isinstance(failed, sluice.TransientStoreError), failed
            assert took < LIMIT_S, took
        finally:
            services.close()


def test_the_retry_list_holds_what_the_outage_parked(down_env: dict[str, str]) -> None:
    """The oracle is Redis itself: the envelope ledger-redrive will read."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    services = sluice.connect({**down_env, "SLUICE_DATABASE_URL": url})
    try:
        assert sluice.record_usage(services, entry("call-parked")) == "queued"
    finally:
        services.close()
    redis = redis_connect(Settings.from_env({**down_env, "SLUICE_DATABASE_URL": url}))
    [raw] = redis.lrange(RETRY_QUEUE, 0, -1)
    parked = RetryEnvelope.parse(raw)
    assert parked.id == "call-parked" and parked.entry["costMicros"] == 9
    assert parked.last_error and "store_unavailable" in parked.last_error
