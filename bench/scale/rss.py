"""The rss tick past one function: 1,000 completed scopes over 300 distinct source sets
of 3 feeds each, every feed answering in 300 ms on loopback, on Postgres.

The inline tick (``rssQueuePipeline`` off) builds every due key serially in the tick.
With the pipeline on, the tick publishes one signed ``rss.ingest`` message per due key
and 1, 4 or 16 consumers (each its own process with its own connections, as separate
function instances are, running the real consumer: verify, idempotency, handler) build
them through the same catalog, locks and throttle. Each run starts from the same state (no builds, no validators). Reported: wall time from the tick's start to
the last build, builds per ten-minute tick window (what the capacity would finish; the
inline tick has a 240 s budget), the speed-up against one consumer (target: at least
0.7 x the consumer count), and that no key was built twice.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from datetime import UTC, datetime
from typing import Any, NamedTuple

from bench.common import Row, row
from bench.scale.pg import scratch_url

SETS = int(os.environ.get("SLUICE_BENCH_SCALE_RSS_SETS", "300"))
SCOPES = int(os.environ.get("SLUICE_BENCH_SCALE_RSS_SCOPES", "1000"))
FEEDS_PER_SET = 3
DELAY_S = 0.3
CONSUMERS = tuple(int(c) for c in os.environ.get("SLUICE_BENCH_SCALE_RSS_CONSUMERS",
                                                  "1,4,16").split(","))
SECRET = "bench-scale-queue-secret-0123456789"
WINDOW_S = 600
INLINE_BUDGET_S = 240


class Run(NamedTuple):
    wall_s: float
    builds: int
    built_twice: int


class Collector:
    """Stands in for SQS: the tick's publishes land on a queue the consumer processes read."""

    class Decision(NamedTuple):
        outcome: Any
        reason: str | None = None

    class Outcome(NamedTuple):
        value: str

    def __init__(self, messages: Any) -> None:
        self.messages = messages
        self.published = 0

    def deliver_local(self, body: str, message_id: str) -> Any:
        self.messages.put((body, message_id))
        self.published += 1
        return self.Decision(self.Outcome("done"))


def _consumer(url: str, messages: Any, report: Any) -> None:
    """One consumer, as its own process (a separate function instance, as SQS's event
    source mapping runs them): the real ``rss.ingest`` consumer, one message at a time."""
    from sluice.egress.tls import tls_context
    from sluice.queues.handlers import build_refresh
    from sluice.queues.runtime import consumers_for

    services = _services(url)
    try:
        consumer = consumers_for(services, registry=None)["rss.ingest"]
        # warm, as a function is after its first message: the build's imports, the process's
        # TLS context (the CA bundle); the first tick a cold function pays them once
        build_refresh()
        tls_context()
        report.put(("ready", ""))
        while (message := messages.get()) is not None:
            body, message_id = message
            decision = consumer.deliver_local(body, message_id)
            report.put(("done", str(getattr(decision.outcome, "value", decision.outcome))))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        report.put(("error", repr(exc)))
    finally:
        services.close()


def _services(url: str) -> Any:
    from sluice.core.services import Services
    from sluice.core.settings import Settings

    return Services.from_settings(Settings.from_env({
        "SLUICE_DATABASE_URL": url, "SLUICE_FEED_ALLOW_HOSTS": "127.0.0.1",
        "SLUICE_QUEUE_SIGNING_SECRET": SECRET,
        # the stand-in serves every publisher from one address: let a build fetch its
        # three feeds at once, as it would from three hosts
        "SLUICE_RSS_PER_HOST_CONNECTIONS": "3",
        "SLUICE_TENANT_INGESTION_TIME_BUDGET_MS": str(900_000)}))


def _seed(services: Any, feeds: Any) -> None:
    from sluice.rss.store import RssStore

    store = RssStore(services.db)
    sets = [tuple(store.add_source(feeds.add_rss(f"/s{k}/f{j}", items=3)).id
                  for j in range(FEEDS_PER_SET)) for k in range(SETS)]
    for n in range(SCOPES):
        store.put_scope(f"scope-{n:04d}", f"tenant-{n}", sets[n % SETS], "en", True)


def _reset(services: Any) -> None:
    with services.db.transaction() as tx:
        for statement in ("DELETE FROM rss_builds", "DELETE FROM rss_build_locks",
                          "DELETE FROM rss_stories", "DELETE FROM queue_completed_keys",
                          "UPDATE rss_scopes SET last_refreshed_at = NULL",
                          ("UPDATE rss_sources SET etag = NULL, last_modified = NULL, "
                          "next_attempt_at = NULL, consecutive_failures = 0")):
            tx.execute(statement)


def _count_builds(services: Any) -> int:
    with services.db.transaction() as tx:
        row_ = tx.fetchone("SELECT count(*) AS n FROM rss_builds WHERE key <> 'global'")
    return int(row_["n"]) if row_ else 0


def _tick(services: Any) -> dict[str, Any]:
    from sluice.jobs.registry import Deadline
    from sluice.rss.tick import refresh_tick

    return refresh_tick(services, tenant_ingestion=True, deadline=Deadline(900),
                        started_at=datetime.now(UTC))


def _inline(services: Any) -> Run:
    from sluice.store.flags import FlagStore

    FlagStore(services.state).set("rssQueuePipeline", False)
    _reset(services)
    started = time.perf_counter()
    result = _tick(services)
    wall = time.perf_counter() - started
    builds = result["catalog"]["builds"] - 1  # less the global catalog
    return Run(wall, builds, max(0, builds - _count_builds(services)))


def _pipeline(url: str, services: Any, consumers: int) -> Run:
    from sluice.queues.publish import REGISTRY
    from sluice.queues.runtime import publisher_of
    from sluice.store.flags import FlagStore

    FlagStore(services.state).set("rssQueuePipeline", True)
    _reset(services)
    publisher_of(services)
    processes = multiprocessing.get_context("spawn")
    messages, report = processes.Queue(), processes.Queue()
    workers = [processes.Process(target=_consumer, args=(url, messages, report), daemon=True)
               for _ in range(consumers)]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:  # every consumer connected and ready before the clock starts
            kind, detail = report.get(timeout=120)
            assert kind == "ready", detail
        collector = Collector(messages)
        REGISTRY.register("rss.ingest", collector)
        started = time.perf_counter()
        result = _tick(services)
        for _ in range(collector.published):
            kind, detail = report.get(timeout=600)
            assert kind == "done", detail
        wall = time.perf_counter() - started
    finally:
        REGISTRY.clear()
        for _ in workers:
            messages.put(None)
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()
    from sluice.rss.fanout import tick_report

    report_ = tick_report(services.db, result["fanOut"]["tickId"]) or {}
    builds = int(report_.get("built", 0))
    assert report_.get("failed") == 0 and report_.get("pending") == 0, report_
    return Run(wall, builds, max(0, builds - _count_builds(services)))


def run() -> list[Row]:
    from bench.scale.standins import SlowFeeds

    with scratch_url() as url, SlowFeeds(DELAY_S) as feeds:
        services = _services(url)
        try:
            _seed(services, feeds)
            inline = _inline(services)
            runs = {c: _pipeline(url, services, c) for c in CONSUMERS}
        finally:
            services.close()
    assert inline.builds == SETS and all(r.builds == SETS for r in runs.values()), (
        inline, runs)
    assert inline.built_twice == 0 and all(r.built_twice == 0 for r in runs.values())
    setup = f"{SCOPES} scopes, {SETS} sets x {FEEDS_PER_SET} feeds, {int(DELAY_S * 1000)} ms each"
    one = runs[CONSUMERS[0]]
    top = max(CONSUMERS)
    rows = [row(f"scale rss: wall time, {top} consumers vs inline tick", runs[top].wall_s,
                inline.wall_s, "s", False, note=setup),
            row("scale rss: builds per tick window", SETS * WINDOW_S / runs[top].wall_s,
                SETS * INLINE_BUDGET_S / inline.wall_s, "builds/10 min", True,
                note=f"{top} consumers vs inline (240 s budget)")]
    for c in CONSUMERS:
        speedup = one.wall_s / runs[c].wall_s
        rows.append(row(f"scale rss: speed-up, {c} consumer(s)", speedup, float(c), "x", True,
                        note=f"{runs[c].wall_s:.1f} s; target ratio >= 0.7; built twice: "
                             f"{runs[c].built_twice}"))
    return rows
