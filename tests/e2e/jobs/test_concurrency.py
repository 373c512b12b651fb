"""Concurrent runs: twenty cron GETs of one job record one run (the rest answer
`already_running`), and 2 or 8 drains at once (processes, threads) never run one job
twice at a time, claim nothing twice and lose nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from sluice.billing.usage import insert_entries
from sluice.core.services import Services
from sluice.delivery.channels import Outbound
from sluice.delivery.drain import Deliverer
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.http.app import create_app
from sluice.jobs.registry import Deadline
from sluice.jobs.runs import RunStore
from tests.conftest import BASE_ENV, CRON_SECRET, ROOT, free_port
from tests.integration.billing.usage_data import entry
from tests.providers.polar import PolarStandIn
from tests.providers.webhook import WebhookReceiver

SECRET = "webhook-secret-for-tests-0123456789"
FLUSH_ROUTE = "/api/admin/ai/metering/flush"


@pytest.fixture
def polar() -> Iterator[PolarStandIn]:
    with PolarStandIn() as server:
        yield server


@contextmanager
def serving(services: Services) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(services), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(500):
            if server.started:
                break
            threading.Event().wait(0.01)
        assert server.started
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_twenty_concurrent_cron_gets_record_one_run(
        db_url: str, make_services: Callable[..., Services], polar: PolarStandIn) -> None:
    services = make_services(db_url, POLAR_ACCESS_TOKEN=polar.token, POLAR_API_URL=polar.url)
    insert_entries(services.db, [entry(0)])
    release = threading.Event()
    polar.on_request = lambda: release.wait(timeout=60)  # the one run holds until the rest answered
    skipped_so_far: list[int] = []
    lock = threading.Lock()
    with serving(services) as base, ThreadPoolExecutor(20) as pool:
        def get(_: int) -> dict[str, object]:
            response = httpx.get(base + FLUSH_ROUTE, timeout=90,
                                 headers={"Authorization": f"Bearer {CRON_SECRET}"})
            assert response.status_code == 200, response.text
            body: dict[str, object] = response.json()
            if body == {"skipped": "already_running"}:
                with lock:
                    skipped_so_far.append(1)
                    if len(skipped_so_far) == 19:
                        release.set()
            return body

        results = list(pool.map(get, range(20)))
    release.set()
    skipped = [r for r in results if r == {"skipped": "already_running"}]
    assert len(skipped) == 19, results
    ran = [r for r in results if r not in skipped]
    assert ran == [{"processed": 1, "failed": 0, "skipped": 0, "reason": None}]
    runs = RunStore(services.db).recent("metering-flush", limit=50)
    assert sorted(r["outcome"] for r in runs) == ["ok"] + ["skipped"] * 19
    assert polar.max_in_flight == 1


@pytest.mark.parametrize("processes", [2, 8])
def test_concurrent_processes_never_run_a_job_twice_at_once(
        processes: int, pg_url: str, make_services: Callable[..., Services],
        polar: PolarStandIn) -> None:
    services = make_services(pg_url)
    rows = 40
    insert_entries(services.db, [entry(i) for i in range(rows)])
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLUICE_", "CRON_", "POLAR_"))}
    env.update(BASE_ENV, SLUICE_DATABASE_URL=pg_url, POLAR_ACCESS_TOKEN=polar.token,
               POLAR_API_URL=polar.url)
    procs = [subprocess.Popen([sys.executable, "-m", "sluice.cli.main", "run", "metering-flush",
                               "--json"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(processes)]
    for proc in procs:
        proc.communicate(timeout=120)
        assert proc.returncode == 0
    leftover = subprocess.run([sys.executable, "-m", "sluice.cli.main", "run", "metering-flush",
                               "--json"], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=120, check=False)
    assert leftover.returncode == 0, leftover.stderr
    assert polar.max_in_flight == 1, "two runs of the job sent at the same time"
    assert len(polar.events) == rows, "nothing lost"
    assert max(polar.received.values()) == 1, "nothing sent twice"


@pytest.mark.parametrize("drains", [2, 8])
def test_concurrent_delivery_drains_claim_nothing_twice(
        drains: int, pg_url: str, make_services: Callable[..., Services]) -> None:
    # claims are what is tested: the shared host rate (10/s) must not set entries aside
    services = make_services(pg_url, SLUICE_WEBHOOK_SIGNING_SECRET=SECRET,
                             SLUICE_WEBHOOK_HOST_RATE_PER_SECOND="1000")
    store = DeliveryStore(services.db)
    with WebhookReceiver(SECRET) as hook:
        keys = [f"k{i}" for i in range(60)]
        for key in keys:
            store.enqueue("webhook", hook.url, {"text": key}, idempotency_key=key)

        def drain(_: int) -> int:
            with Outbound.open(services.settings) as client:
                summary = Deliverer.from_services(services, client).drain(Deadline(60))
            return int(summary["recovered"])

        with ThreadPoolExecutor(drains) as pool:
            delivered = sum(pool.map(drain, range(drains)))
        received = [r["key"] for r in hook.received]
    assert delivered == len(keys)
    assert sorted(received) == sorted(keys), "each entry sent once, none lost"
    assert {e.status for e in store.list(limit=500)} == {DeliveryStatus.ACKED}
