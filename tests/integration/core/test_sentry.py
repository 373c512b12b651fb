"""Errors and cron check-ins reach a real (local) Sentry ingest endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sentry_sdk

from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.jobs.runner import run_job
from tests.integration.jobs.test_cron_contract import job
from tests.providers.sentry import SentryIngest


@pytest.fixture
def sentry() -> Iterator[SentryIngest]:
    with SentryIngest() as ingest:
        yield ingest
    sentry_sdk.get_client().close()
    sentry_sdk.init(dsn=None)


def test_check_ins_and_errors_are_sent(sentry: SentryIngest, sqlite_url: str,
                                       make_services: Any) -> None:
    services: Services = make_services(sqlite_url)
    services.reporter = Reporter(sentry_dsn=sentry.dsn, environment="test")
    assert run_job(job("record_context"), services, "schedule").status == 200
    assert run_job(job("boom"), services, "schedule").status == 500
    assert run_job(job("some_failures", failure_keys=("failed",)), services, "cli").status == 200
    sentry_sdk.flush(timeout=5)

    check_ins = [(c["monitor_slug"], c["status"]) for c in sentry.of_type("check_in")]
    assert check_ins == [
        ("test-record_context", "in_progress"), ("test-record_context", "ok"),
        ("test-boom", "in_progress"), ("test-boom", "error"),
        ("test-some_failures", "in_progress"), ("test-some_failures", "ok"),
    ]
    events = sentry.of_type("event")
    assert any(e.get("exception", {}).get("values", [{}])[-1].get("value") == "'drain exploded'"
               for e in events)
    assert any("drain reported 2 failure(s)" in (e.get("message") or e.get("logentry", {}).get(
        "message", "")) for e in events)


def test_error_reports_accept_any_field_name(caplog: Any) -> None:
    Reporter().error("ctx", None, message="plain words", args="a", name="n", requestId="r")
    [record] = [r for r in caplog.records if r.getMessage() == "[ctx] plain words"]
    assert record.detail_args == "a" and record.requestId == "r"  # type: ignore[attr-defined]
