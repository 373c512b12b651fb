"""The operations surface: real figures for every queue Sluice keeps, and the last run of every job.

Each section is measured on its own; a store that cannot be read shows its error
in its own section instead of hiding the others. Nothing here is a literal.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sluice.core.errors import SluiceError
from sluice.core.extensions import packs_on
from sluice.core.services import Services
from sluice.core.times import jsonable
from sluice.jobs.registry import JOBS
from sluice.jobs.runs import RunStore
from sluice.store.db import utcnow

OLDEST_AGE_METRIC = "ApproximateAgeOfOldestMessage"


def _iso(value: Any) -> Any:
    return jsonable(value)


def _section(measure: Callable[[], Any]) -> Any:
    try:
        return measure()
    except SluiceError as exc:
        return {"error": exc.code, "message": exc.message}
    except Exception as exc:  # noqa: BLE001 - a driver/SDK failure shows in its own section
        return {"error": type(exc).__name__, "message": str(exc)[:300]}


def jobs_figures(services: Services) -> list[dict[str, Any]]:
    last = RunStore(services.db).last_runs()
    rows = []
    for job in JOBS.values():
        run = last.get(job.name)
        rows.append({
            "job": job.name, "route": job.route, "schedule": job.schedule,
            "lastRun": None if run is None else {
                "startedAt": _iso(run["started_at"]), "trigger": run["trigger"],
                "outcome": run["outcome"], "durationMs": run["duration_ms"],
                "result": run["result"]},
        })
    return rows


def _oldest_age_s(cloudwatch: Any, queue_name: str) -> float | None:
    """SQS keeps no age per queue; CloudWatch's ApproximateAgeOfOldestMessage does."""
    now = utcnow()
    stats = cloudwatch.get_metric_statistics(
        Namespace="AWS/SQS", MetricName=OLDEST_AGE_METRIC,
        Dimensions=[{"Name": "QueueName", "Value": queue_name}],
        StartTime=now - timedelta(minutes=15), EndTime=now, Period=60, Statistics=["Maximum"])
    points = sorted(stats.get("Datapoints", []), key=lambda p: p["Timestamp"])
    return float(points[-1]["Maximum"]) if points else None


def topic_figures(services: Services, *, cloudwatch: Any = None) -> list[dict[str, Any]]:
    from sluice.queues.deadletters import LocalDeadLetters
    from sluice.queues.runtime import publisher_of
    from sluice.queues.topics import TOPICS, dlq_name, queue_name

    settings = services.settings
    rows: list[dict[str, Any]] = []
    if settings.queue_mode == "local":
        local = LocalDeadLetters(services.db)
        for topic in TOPICS:
            rows.append({"topic": topic, "mode": "local", "implemented": not TOPICS[topic].reserved,
                         "queue": {"inProcess": True},
                         "dlq": {"depth": local.count(topic)}})
        return rows
    sqs = publisher_of(services).sqs
    if cloudwatch is None:
        cloudwatch = services.cloudwatch
    def measure(queue: str) -> dict[str, Any]:
        figures: dict[str, Any] = dict(sqs.depth(sqs.url(queue)))
        figures["oldestAgeS"] = _oldest_age_s(cloudwatch, queue)
        figures["name"] = queue
        return figures

    for topic in TOPICS:
        name, dead = queue_name(settings.queue_prefix, topic), dlq_name(settings.queue_prefix, topic)
        rows.append({
            "topic": topic, "mode": "sqs", "implemented": not TOPICS[topic].reserved,
            "queue": _section(lambda q=name: measure(q)),  # type: ignore[misc]
            "dlq": _section(lambda q=dead: measure(q)),  # type: ignore[misc]
        })
    return rows


def queue_figures(services: Services, *, cloudwatch: Any = None) -> dict[str, Any]:
    """Every queue's figures: the topics' and the quarantine, then those of the packs that
    are on (the ledger's retry lists, the metering outbox, the delivery queue, the rss
    fan-out, the erasure requests), and the jobs' last runs."""
    from sluice.queues.deadletters import Quarantine

    on = packs_on()
    figures: dict[str, Any] = {
        "generatedAt": _iso(utcnow()),
        "topics": _section(lambda: topic_figures(services, cloudwatch=cloudwatch)),
        "quarantine": _section(lambda: {"depth": Quarantine(services.db).count()}),
    }
    if "ledger" in on or "metering" in on:
        from sluice.billing.usage import usage_figures

        usage = _section(lambda: usage_figures(services.db, services.redis))
        if "ledger" in on:
            figures["ledgerRetry"] = (usage.get("ledgerRetry") if "error" not in usage
                                      else usage) or {"error": "redis_not_configured"}
        if "metering" in on:
            figures["meteringOutbox"] = (usage.get("meteringOutbox") if "error" not in usage
                                         else usage)
    if "delivery" in on:
        from sluice.delivery.store import DeliveryStore

        figures["delivery"] = _section(lambda: DeliveryStore(services.db).stats())
    if "rss" in on:
        from sluice.rss.fanout import recent_ticks

        figures["rssFanOut"] = _section(lambda: recent_ticks(services.db))
    if "erasure" in on:
        from sluice.erasure.requests import ErasureStore

        figures["erasure"] = _section(lambda: ErasureStore(services.db).summary())
    figures["jobs"] = _section(lambda: jobs_figures(services))
    return figures
