"""What each Lambda function costs: measured time per run (or per message) and the bill.

For every function in serverless.yml: each scheduled job is run through ``run_job`` (the
cron path) with nothing to do, on Postgres (as deployed; loopback, so the network is
faster than a managed database's); each consumer handles SQS batches of 10 signed
messages with a no-op handler (parse, verify, dedupe against completed keys in Postgres,
record); the HTTP function serves a no-op job's cron ``GET``. CPU time
(``time.process_time``) and wall time are medians over ``RUNS`` runs.

Lambda bills wall time, rounded up to the millisecond, times the memory size: the cost is
``invocations × (billed seconds × GB × PRICE_GB_S + PRICE_REQUEST)``, per month (30 days)
at the function's schedule, or per million messages for consumers (one invocation a batch
of 10). The baseline is the same bill at Lambda's 1 ms minimum, the floor any function
pays, so a ratio near 1 means Sluice's own work is a small part of the bill.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from bench.common import Row, row, scratch_database
from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.jobs.registry import JOBS
from sluice.jobs.runner import run_job

ROOT = Path(__file__).resolve().parent.parent
# AWS Lambda on x86_64 (eu-north-1, the stage's default region, as in us-east-1).
PRICE_GB_S = 0.0000166667
PRICE_REQUEST = 0.20 / 1_000_000
RUNS = int(os.environ.get("SLUICE_BENCH_COST_RUNS", "15"))
MONTH_S = 30 * 24 * 3600
REDIS_URL = os.environ.get("SLUICE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
SECRET = "bench-queue-secret-0123456789abcdef"


def invocations_per_month(expression: str) -> float:
    """Runs a month of an EventBridge ``rate(...)`` or ``cron(...)`` expression."""
    from croniter import croniter

    if expression.startswith("rate("):
        amount, unit = expression[5:-1].split()
        seconds = {"minute": 60, "hour": 3600, "day": 86400}[unit.rstrip("s")]
        return MONTH_S / (int(amount) * seconds)
    fields = expression[5:-1].split()  # minute hour day month weekday year
    minute, hour, day, month, weekday = fields[:5]
    weekday = "*" if weekday == "?" else weekday
    day = "*" if day == "?" else day
    it = croniter(f"{minute} {hour} {day} {month} {weekday}", 0)
    count = 0
    while it.get_next(float) < MONTH_S:
        count += 1
    return float(count)


def bill(wall_s: float, memory_mb: int) -> float:
    billed = max(1, -(-wall_s * 1000 // 1)) / 1000  # rounded up to the millisecond
    return billed * memory_mb / 1024 * PRICE_GB_S + PRICE_REQUEST


def _functions() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load((ROOT / "serverless.yml").read_text().replace("!GetAtt", ""))
    memory = int(data["provider"].get("memorySize", 1024))
    found = {}
    for name, fn in data["functions"].items():
        env = fn.get("environment") or {}
        schedules = [event["schedule"]["rate"] for event in fn.get("events") or []
                     if isinstance(event, dict) and isinstance(event.get("schedule"), dict)]
        found[name] = {"memory": int(fn.get("memorySize", memory)), "job": env.get("SLUICE_JOB"),
                       "topic": env.get("SLUICE_TOPIC"), "schedules": schedules}
    return found


def _measure(fn: Any) -> tuple[float, float]:
    """Median (cpu seconds, wall seconds) of ``RUNS`` calls, after two warm-up calls."""
    fn()
    fn()
    cpu, wall = [], []
    for _ in range(RUNS):
        c, w = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return statistics.median(cpu), statistics.median(wall)


def run() -> list[Row]:
    from tests.providers.polar import PolarStandIn

    rows: list[Row] = []
    functions = _functions()
    prefix = f"sluice-bench:{uuid.uuid4().hex[:8]}:"
    with scratch_database() as pg, PolarStandIn() as polar, tempfile.TemporaryDirectory():
        settings = Settings.from_env({
            "SLUICE_DATABASE_URL": pg.conninfo, "CRON_SECRET": "bench-cron-secret-0123456789",
            "POLAR_ACCESS_TOKEN": polar.token, "POLAR_API_URL": polar.url,
            "SLUICE_REDIS_URL": REDIS_URL, "SLUICE_REDIS_KEY_PREFIX": prefix,
            "SLUICE_QUEUE_SIGNING_SECRET": SECRET})
        services = Services(settings, pg, Reporter())
        for name, fn in functions.items():
            job = JOBS.get(fn["job"] or "")
            if job is None:
                continue
            cpu, wall = _measure(lambda job=job: run_job(job, services, "schedule"))
            month = sum(invocations_per_month(s) for s in fn["schedules"])
            rows.append(row(
                f"cost: {name} ({', '.join(fn['schedules'])}, {fn['memory']} MB), idle run",
                month * bill(wall, fn["memory"]), month * bill(0.001, fn["memory"]),
                "USD/month", False,
                note=f"{cpu * 1000:.1f} ms CPU, {wall * 1000:.1f} ms wall a run; "
                     f"{month:,.0f} runs/month; ${PRICE_GB_S}/GB-s + $0.20/1M requests"))
        rows += _consumer_rows(services, functions)
        rows += _http_row(services, functions)
        raw = services.redis.client
        keys = list(raw.scan_iter(match=prefix + "*", count=1000))
        if keys:
            raw.delete(*keys)
    return rows


def _consumer_rows(services: Services, functions: dict[str, dict[str, Any]]) -> list[Row]:
    import json

    from sluice.queues.consumer import Consumer
    from sluice.queues.keys import CompletedKeys
    from sluice.queues.signing import Signer

    signer = Signer([SECRET])
    rows = []
    for name, fn in functions.items():
        topic = fn["topic"]
        if not topic:
            continue
        consumer = Consumer(topic, lambda message, inbound: None, services, registry=None)
        consumer.keys = CompletedKeys(services.db)  # the SQL store, as without Redis

        def batch(topic: str = topic, consumer: Consumer = consumer, name: str = name) -> None:
            records = []
            for _ in range(10):
                message = signer.sign({"topic": topic, "batchId": str(uuid.uuid4()),
                                       "sourceId": "bench"})
                records.append({"messageId": str(uuid.uuid4()), "receiptHandle": "bench",
                                "body": json.dumps(message),
                                "attributes": {"ApproximateReceiveCount": "1"},
                                "messageAttributes": {}, "eventSource": "aws:sqs",
                                "eventSourceARN": f"arn:aws:sqs:eu-north-1:1:{name}"})
            assert consumer.lambda_handler({"Records": records}) == {"batchItemFailures": []}

        cpu, wall = _measure(batch)
        per_million = 1_000_000 / 10
        rows.append(row(f"cost: {name} (batches of 10, {fn['memory']} MB), no-op handler",
                        per_million * bill(wall, fn["memory"]),
                        per_million * bill(0.001, fn["memory"]), "USD/1M msgs", False,
                        note=f"{cpu * 100:.2f} ms CPU, {wall * 100:.2f} ms wall a message; "
                             f"completed keys in Postgres; ${PRICE_GB_S}/GB-s"))
    return rows


def _http_row(services: Services, functions: dict[str, dict[str, Any]]) -> list[Row]:
    from fastapi.testclient import TestClient

    from bench.runner import NOOP
    from sluice.http.app import _job_routes, create_app

    memory = functions["http"]["memory"]
    app = create_app(services)
    app.include_router(_job_routes(NOOP))
    headers = {"authorization": f"Bearer {services.settings.cron_secret}"}
    with TestClient(app) as client:
        cpu, wall = _measure(lambda: client.get(NOOP.route, headers=headers))
    per_million = 1_000_000
    return [row(f"cost: http ({memory} MB), no-op job cron GET", per_million * bill(wall, memory),
                per_million * bill(0.001, memory), "USD/1M requests", False,
                note=f"{cpu * 1000:.1f} ms CPU, {wall * 1000:.1f} ms wall a request; "
                     f"${PRICE_GB_S}/GB-s")]


if __name__ == "__main__":
    for result in run():
        print(result)
