"""One TLS context per process: outbound clients stop loading the CA bundle every run."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import httpcore
import pytest

from sluice.core.services import Services
from sluice.egress import AddressGuard
from sluice.egress.tls import tls_context
from sluice.jobs.registry import JOBS
from sluice.jobs.runner import run_job
from sluice.rss.fetch import feed_client


def test_one_verifying_context_per_process_and_trust_setting() -> None:
    context = tls_context()
    assert context is tls_context()
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert tls_context(trust_env=False) is tls_context(trust_env=False)
    assert tls_context(trust_env=False) is not context


@pytest.mark.parametrize(("job", "env", "contexts"), [
    # the providers' client (SSL_CERT_FILE honoured) and the webhooks' (not)
    ("delivery-drain", {}, [True, False]),
    ("metering-flush", {"POLAR_ACCESS_TOKEN": "polar_oat_test",
                        "POLAR_API_URL": "http://127.0.0.1:9/v1"}, [True]),
])
def test_each_run_builds_its_clients_on_the_process_contexts(
        job: str, env: dict[str, str], contexts: list[bool], db_url: str,
        make_services: Callable[..., Services], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    real = httpcore.ConnectionPool

    def spy(*args: Any, **kwargs: Any) -> httpcore.ConnectionPool:
        seen.append(kwargs.get("ssl_context"))
        return real(*args, **kwargs)

    monkeypatch.setattr(httpcore, "ConnectionPool", spy)
    services = make_services(db_url, **env)
    for _ in range(2):
        assert run_job(JOBS[job], services, "cli").outcome == "ok"
    assert seen == [tls_context(trust_env=t) for t in contexts] * 2


def test_the_feed_client_uses_the_context_that_ignores_the_environment() -> None:
    with feed_client(AddressGuard(), timeout_s=5, max_connections=2) as client:
        pool = client._client._transport._pool  # type: ignore[attr-defined]
        assert pool._ssl_context is tls_context(trust_env=False)
