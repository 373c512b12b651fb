"""Provider and store faults: the drain answers in time, charges nothing, and finishes later.

Provider faults (metering-flush against the Polar stand-in, delivery-drain against the
webhook stand-in, both behind a ``FaultProxy``): 429 with Retry-After, 500, timeouts,
connection resets and 401 for a few runs, then the provider recovers. Store faults
(Postgres): the backends terminated mid-drain and a table lock held past the run's
budget; (Redis) a Redis of the sweep's own stopped mid-redrive, then started again.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.chaos.kill import (
    CRON_SECRET,
    Counts,
    Delivery,
    Metering,
    Redrive,
    Tally,
    _db,
    run_to_completion,
    sluice,
)
from bench.chaos.proxy import FaultProxy
from bench.chaos.stores import ScratchStores

PROVIDER_FAULTS = ("429+Retry-After", "500", "timeout", "reset", "401")
OUTAGE_RUNS = 2
STORE_BUDGET_S = 3.0
MARGIN_S = 1.0
# A typed answer must come within the budget plus the margin the statements may use,
# plus this much for the process itself on a busy machine.
SLACK_S = 5.0


def _addr(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").partition("/")[0].partition(":")
    return host, int(port)


def _env(url: str, extra: dict[str, str]) -> dict[str, str]:
    return {"CRON_SECRET": CRON_SECRET, "SLUICE_STAGE": "chaos", "SLUICE_DATABASE_URL": url,
            **extra}


def _complete(scenario: Any, url: str, env: dict[str, str], notes: list[str]) -> None:
    notes += run_to_completion(scenario, url, env, "after the fault")


# --- provider faults --------------------------------------------------------------------


def _outage_runs(scenario: Any, url: str, env: dict[str, str], fault: str, *, runs: int,
                 between: bool) -> list[str]:
    """The drain run ``runs`` times while the provider is down; each must end ok or partial."""
    notes: list[str] = []
    for _ in range(runs):
        if between:
            scenario.between(url)
        down = sluice(["run", scenario.job, "--json"], env)
        if down.returncode not in (0, 2):
            notes.append(f"{fault}: run during the outage exited {down.returncode}: "
                         f"{down.stderr[-300:]}")
    return notes


def metering_fault(stores: ScratchStores, backend: str, fault: str) -> Counts:
    with ExitStack() as stack:
        scenario = Metering(stack)
        proxy = stack.enter_context(FaultProxy(_addr(scenario.polar.url)))
        url = stores.fresh(backend)
        try:
            env = _env(url, {**scenario.prepare(url), "POLAR_API_URL": proxy.url})
            notes: list[str] = []
            body: dict[str, Any] | str = {"error": fault}
            headers = {"Retry-After": "1"} if fault.startswith("429") else {}
            if fault in ("reset", "timeout"):
                proxy.set("reset" if fault == "reset" else "hang")
            else:
                status = int(fault.partition("+")[0])
                scenario.polar.answers = [(status, body, headers)] * 100
            notes += _outage_runs(scenario, url, env, fault,
                                  runs=1 if fault == "timeout" else OUTAGE_RUNS, between=False)
            if proxy.connections == 0 or scenario.polar.events:
                notes.append(f"{fault}: the outage was not met (nothing reached the proxy, "
                             "or Polar took events while down)")
            scenario.polar.answers = []
            proxy.set("pass")
            _complete(scenario, url, env, notes)
            counts = scenario.check(url)
            counts.burned += _extra_attempts(url, "SELECT attempt_count AS n FROM "
                                                  "ai_usage_metering_outbox")
            counts.notes = notes + counts.notes
            return counts
        finally:
            stores.drop(url)


def delivery_fault(stores: ScratchStores, backend: str, fault: str) -> Counts:
    with ExitStack() as stack:
        scenario = Delivery(stack)
        proxy = stack.enter_context(FaultProxy(_addr(scenario.hook.url)))
        url = stores.fresh(backend)
        try:
            target = proxy.url + scenario.hook.PATH
            env = _env(url, {**scenario.prepare(url, recipient=target),
                             "SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS": "1"})
            scenario.keys.remove("chaos:sent-inline")
            notes: list[str] = []
            if fault in ("reset", "timeout"):
                proxy.set("reset" if fault == "reset" else "hang")
            else:
                scenario.hook.answers = [int(fault.partition("+")[0])] * 100
            notes += _outage_runs(scenario, url, env, fault, runs=OUTAGE_RUNS, between=True)
            if proxy.connections == 0 or scenario.hook.delivered:
                notes.append(f"{fault}: the outage was not met (nothing reached the proxy, "
                             "or the receiver took deliveries while down)")
            scenario.hook.answers = []
            scenario.hook.received.clear()
            proxy.set("pass")
            _complete(scenario, url, env, notes)
            counts = scenario.check(url)
            # A send whose outcome was unknown (a hang, a reset after sending) keeps its
            # attempt by design: it may have arrived. Only the others count as burned.
            counts.burned += _extra_attempts(
                url, "SELECT attempts - unknown_sends AS n FROM delivery_queue "
                     "WHERE status = 'acked'")
            counts.notes = notes + counts.notes
            return counts
        finally:
            stores.drop(url)


def _extra_attempts(url: str, sql: str) -> int:
    """Attempts charged beyond the one that succeeded."""
    db = _db(url)
    with db.transaction() as tx:
        rows = tx.fetchall(sql)
    db.close()
    return sum(max(0, int(r["n"]) - 1) for r in rows)


# --- store faults (in process, with a short budget) -------------------------------------


@dataclass
class StoreRun:
    status: int
    body: dict[str, Any]
    seconds: float


def run_in_process(url: str, job_name: str, env: dict[str, str], *, budget_s: float,
                   services_hook: Callable[[Any], None] | None = None) -> StoreRun:
    from sluice.core.observe import Reporter, logger
    from sluice.core.services import Services
    from sluice.core.settings import Settings
    from sluice.jobs.registry import JOBS
    from sluice.jobs.runner import run_job
    from sluice.store.db import open_database

    settings = Settings.from_env({**_env(url, env),
                                  "SLUICE_DEADLINE_MARGIN_SECONDS": str(int(MARGIN_S))})
    services = Services(settings, open_database(url), Reporter())
    if services_hook is not None:
        services_hook(services)
    job = JOBS[job_name]._replace(budget_s=budget_s)
    started = time.monotonic()
    level = logger.log_level
    logger.setLevel("CRITICAL")  # the error the fault causes is expected: keep the table clean
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            outcome = run_job(job, services, "cli")
        seconds = time.monotonic() - started  # until the answer, not the pool's shutdown
    finally:
        logger.setLevel(level)
        services.close()
    return StoreRun(outcome.status, outcome.body, seconds)


def _typed(run: StoreRun, budget_s: float, notes: list[str], what: str) -> int:
    """1 when the run did not answer a typed store error in time (counted as stuck)."""
    cause = run.body.get("error", {}).get("cause") if run.status == 500 else None
    reason = run.body.get("reason")
    typed = cause in ("store_unavailable", "lease_lost") or reason == "store_unavailable"
    late = run.seconds > budget_s + MARGIN_S + SLACK_S
    if not typed or late:
        notes.append(f"{what}: answered {run.status} {run.body} after {run.seconds:.1f} s")
        return 1
    return 0


def _admin_sql(url: str, sql: str) -> None:
    import psycopg

    from bench.common import ADMIN_URL

    del url
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql)


def pg_terminated(stores: ScratchStores) -> Counts:
    """metering-flush: Postgres goes away (its backends terminated, new connections
    refused) while Polar takes the first request, and comes back after the run."""
    with ExitStack() as stack:
        scenario = Metering(stack)
        url = stores.fresh("postgres")
        try:
            env = scenario.prepare(url)
            name = url.rsplit("/", 1)[1]
            fired: list[bool] = []

            def terminate() -> None:
                if not fired:
                    fired.append(True)
                    _admin_sql(url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                    _admin_sql(url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    f"WHERE datname = '{name}' AND pid <> pg_backend_pid()")

            scenario.polar.on_request = terminate
            notes: list[str] = []
            run = run_in_process(url, scenario.job, env, budget_s=STORE_BUDGET_S)
            scenario.polar.on_request = None
            _admin_sql(url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            _lapse_leases(url)  # a lease its run could not release lapses with time
            stuck = _typed(run, STORE_BUDGET_S, notes, "postgres terminated")
            full = _env(url, env)
            _complete(scenario, url, full, notes)
            counts = scenario.check(url)
            counts.stuck += stuck
            counts.burned += _extra_attempts(url, "SELECT attempt_count AS n FROM "
                                                  "ai_usage_metering_outbox")
            counts.notes = notes + counts.notes
            return counts
        finally:
            stores.drop(url)


def _lapse_leases(url: str) -> None:
    from bench.chaos.kill import _utc_past

    db = _db(url)
    with db.transaction() as tx:
        tx.execute("UPDATE job_leases SET expires_at = :past", {"past": _utc_past()})
    db.close()


def pg_table_locked(stores: ScratchStores) -> Counts:
    """metering-flush while another session holds the outbox table past the run's budget."""
    import psycopg

    with ExitStack() as stack:
        scenario = Metering(stack)
        url = stores.fresh("postgres")
        try:
            env = scenario.prepare(url)
            notes: list[str] = []
            with psycopg.connect(url) as holder:
                holder.execute("LOCK TABLE ai_usage_metering_outbox IN ACCESS EXCLUSIVE MODE")
                run = run_in_process(url, scenario.job, env, budget_s=STORE_BUDGET_S)
                holder.rollback()
            stuck = _typed(run, STORE_BUDGET_S, notes, "table lock")
            _complete(scenario, url, _env(url, env), notes)
            counts = scenario.check(url)
            counts.stuck += stuck
            counts.burned += _extra_attempts(url, "SELECT attempt_count AS n FROM "
                                                  "ai_usage_metering_outbox")
            counts.notes = notes + counts.notes
            return counts
        finally:
            stores.drop(url)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class OwnRedis:
    """A redis-server of the sweep's own on another loopback port, stopped and started at will."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-chaos-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: the Redis fault needs its own")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--save", "", "--appendonly", "yes", "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.RedisError:
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()  # SIGTERM: redis writes its append-only file and exits
            self.proc.wait(timeout=10)
            self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class _StopAfter:
    """Delegates to a Redis client; stops the real server before the ``nth`` call of ``op``."""

    def __init__(self, inner: Any, server: OwnRedis, op: str, nth: int) -> None:
        self._inner, self._server, self._op, self._nth = inner, server, op, nth
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name != self._op:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self._nth:
                self._server.stop()
            return attr(*args, **kwargs)

        return call


def redis_stopped(stores: ScratchStores, backend: str) -> Counts:
    """ledger-redrive: its Redis stops between two pages, then comes back."""
    server = OwnRedis()
    server.start()
    try:
        with ExitStack() as stack:
            scenario = Redrive(stack, redis_url=server.url)
            url = stores.fresh(backend)
            try:
                env = scenario.prepare(url)
                notes: list[str] = []

                def hook(services: Any) -> None:
                    services.__dict__["redis"] = _StopAfter(services.redis, server, "eval", 3)

                run = run_in_process(url, scenario.job, env, budget_s=STORE_BUDGET_S,
                                     services_hook=hook)
                stuck = _typed(run, STORE_BUDGET_S, notes, "redis stopped")
                server.start()
                charged = scenario.attempts_charged()
                _complete(scenario, url, _env(url, env), notes)
                counts = scenario.check(url)
                counts.stuck += stuck
                counts.burned += charged
                counts.notes = notes + counts.notes
                return counts
            finally:
                stores.drop(url)
    finally:
        server.close()


# --- the table's rows -------------------------------------------------------------------


@contextmanager
def _stores() -> Iterator[ScratchStores]:
    with ScratchStores() as stores:
        yield stores


def provider_faults(backends: tuple[str, ...], faults: tuple[str, ...] = PROVIDER_FAULTS,
                    progress: Any = None) -> list[Tally]:
    tallies = []
    with _stores() as stores:
        for backend in backends:
            for name, fn in (("metering-flush", metering_fault),
                             ("delivery-drain", delivery_fault)):
                tally = Tally(f"provider faults: {name} [{backend}]", verb="faulted")
                for fault in faults:
                    counts = fn(stores, backend, fault)
                    tally.add(counts)
                    tally.reached += 1
                    if progress is not None:
                        progress(f"{tally.scenario} {fault}: {counts}")
                tallies.append(tally)
    return tallies


def store_faults(backends: tuple[str, ...], progress: Any = None) -> list[Tally]:
    tallies = []
    with _stores() as stores:
        if "postgres" in backends:
            for name, fn in (("store fault: postgres terminated mid metering-flush",
                              pg_terminated),
                             ("store fault: outbox table locked past the budget",
                              pg_table_locked)):
                tally = Tally(name, verb="faulted")
                counts = fn(stores)
                tally.add(counts)
                tally.reached += 1
                if progress is not None:
                    progress(f"{name}: {counts}")
                tallies.append(tally)
        for backend in backends:
            tally = Tally(f"store fault: redis stopped mid ledger-redrive [{backend}]",
                          verb="faulted")
            counts = redis_stopped(stores, backend)
            tally.add(counts)
            tally.reached += 1
            if progress is not None:
                progress(f"{tally.scenario}: {counts}")
            tallies.append(tally)
    return tallies

