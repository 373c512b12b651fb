"""A store that stops answering mid-run (the network partitioned behind a proxy that keeps
both sockets open) is abandoned at the run's deadline: the run ends in time, reports
``store_unavailable``, and its lease and run record are settled by the next run at the
latest."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from sluice.core.services import Services
from sluice.jobs.registry import JOBS, JobContext
from sluice.jobs.runner import run_job
from sluice.jobs.runs import RunStore
from sluice.store.redis_clients import connect
from tests.tcp_proxy import StallingProxy

BUDGET_S = 2.0
MARGIN_S = 1.0
# The run ends by its deadline plus its margin; the rest is room for a busy 2-core machine.
SLACK_S = 4.0

# The proxy the drains below stall (set by each test: a drain is imported by name).
_proxy: list[StallingProxy] = []


def drain_stalling_postgres(ctx: JobContext) -> dict[str, Any]:
    with ctx.services.db.transaction() as tx:
        tx.fetchone("SELECT 1 AS one")
    _proxy[0].stall()
    with ctx.services.db.transaction() as tx:
        tx.fetchone("SELECT 2 AS two")
    return {"reached": "the end"}


def drain_stalling_redis(ctx: JobContext) -> dict[str, Any]:
    ctx.services.redis.llen("stalled")
    _proxy[0].stall()
    ctx.services.redis.llen("stalled")
    return {"reached": "the end"}


def drain_ok(ctx: JobContext) -> dict[str, Any]:
    with ctx.services.db.transaction() as tx:
        tx.fetchone("SELECT 1 AS one")
    return {"reached": "the end"}


def _job(target: str) -> Any:
    return JOBS["state-cleanup"]._replace(
        budget_s=BUDGET_S, target=f"tests.integration.jobs.test_store_deadline:{target}")


@pytest.fixture
def proxy_to() -> Iterator[Callable[[str], StallingProxy]]:
    made: list[StallingProxy] = []

    def make(url: str) -> StallingProxy:
        parts = urlsplit(url)
        proxy = StallingProxy(parts.hostname or "127.0.0.1", parts.port or 0)
        made.append(proxy)
        _proxy[:] = [proxy]
        return proxy

    yield make
    _proxy.clear()
    for proxy in made:
        proxy.close()


def _through(url: str, proxy: StallingProxy) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


@pytest.mark.postgres
def test_a_postgres_that_stops_answering_is_abandoned_at_the_deadline(
        pg_url: str, make_services: Callable[..., Services],
        proxy_to: Callable[[str], StallingProxy]) -> None:
    proxy = proxy_to(pg_url)
    services = make_services(_through(pg_url, proxy),
                             SLUICE_DEADLINE_MARGIN_SECONDS=str(MARGIN_S))

    started = time.monotonic()
    outcome = run_job(_job("drain_stalling_postgres"), services, "cli")
    elapsed = time.monotonic() - started

    assert outcome.outcome == "error", outcome
    assert outcome.body["error"]["cause"] == "store_unavailable", outcome.body
    assert elapsed < BUDGET_S + MARGIN_S + SLACK_S, f"ended after {elapsed:.1f} s"

    # The store is back (reached directly): the next run in this process takes the lease
    # over at once and settles the record the stalled run could not write.
    direct = make_services(pg_url)
    again = run_job(_job("drain_ok"), direct, "cli")
    assert again.outcome == "ok", again
    newest, stalled = RunStore(direct.db).recent("state-cleanup")[:2]
    assert newest["outcome"] == "ok"
    assert stalled["outcome"] == "error"
    assert stalled["result"]["error"]["code"] == "abandoned"


@pytest.mark.redis
def test_a_redis_that_stops_answering_is_abandoned_at_the_deadline(
        sqlite_url: str, redis_server: str, redis_prefix: str,
        make_services: Callable[..., Services],
        proxy_to: Callable[[str], StallingProxy]) -> None:
    proxy = proxy_to(redis_server)
    services = make_services(sqlite_url, SLUICE_DEADLINE_MARGIN_SECONDS=str(MARGIN_S),
                             SLUICE_REDIS_URL=_through(redis_server, proxy),
                             SLUICE_REDIS_KEY_PREFIX=redis_prefix)
    services.__dict__["redis"] = connect(services.settings)

    started = time.monotonic()
    outcome = run_job(_job("drain_stalling_redis"), services, "cli")
    elapsed = time.monotonic() - started

    assert outcome.outcome == "error", outcome
    assert outcome.body["error"]["cause"] == "store_unavailable", outcome.body
    assert "deadline" in outcome.body["error"]["message"]
    assert elapsed < BUDGET_S + MARGIN_S + SLACK_S, f"ended after {elapsed:.1f} s"
    # The database answered throughout: the run settled its own record and lease.
    [run] = RunStore(services.db).recent("state-cleanup")
    assert run["outcome"] == "error" and run["finished_at"] is not None
    assert run_job(_job("drain_ok"), services, "cli").outcome == "ok"
