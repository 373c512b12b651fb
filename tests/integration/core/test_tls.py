"""One TLS context per process: outbound clients stop loading the CA bundle every run."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from shared.core.tls import tls_context

from shared.core.services import Services
from shared.jobs.registry import JOBS
from shared.jobs.runner import run_job
from shared.rss.fetch import AddressGuard, feed_client


def test_one_verifying_context_per_process_and_trust_setting() -> None:
    context = tls_context()
    assert context is tls_context()
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert tls_context(trust_env=False) is tls_context(trust_env=False)
    assert tls_context(trust_env=False) is not context


@pytest.mark.parametrize(("job", "env"), [
    ("delivery-drain", {}),
    ("metering-flush", {"POLAR_ACCESS_TOKEN": "polar_oat_test",
                        "POLAR_API_URL": "http://127.0.0.1:9/v1"}),  # nothing to send: unused
])
def test_each_run_builds_its_client_on_the_process_context(
        job: str, env: dict[str, str], db_url: str, make_services: Callable[..., Services],
        monkeypatch: pytest.MonkeyPatch) -> None:
    verify: list[Any] = []
    real = httpx.Client

    def spy(*args: Any, **kwargs: Any) -> httpx.Client:
        verify.append(kwargs.get("verify"))
        return real(*args, **kwargs)

    monkeypatch.setattr(httpx, "Client", spy)
    services = make_services(db_url, **env)
    for _ in range(2):
        assert run_job(JOBS[job], services, "cli").outcome == "ok"
    assert verify == [tls_context(), tls_context()]


def test_the_feed_client_uses_the_context_that_ignores_the_environment() -> None:
    with feed_client(AddressGuard(), timeout_s=5, max_connections=2) as client:
        pool = client._transport._pool  # type: ignore[attr-defined]
        assert pool._ssl_context is tls_context(trust_env=False)
