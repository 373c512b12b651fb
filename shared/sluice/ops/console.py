"""The console's read models: one card per queue, history series, jobs with their schedules.

Every card is measured from the store it names, with that store's name and the moment it was
read; a store that cannot be read gives its card an error and no figures (never a zero).
The console's pages and their JSON twins under ``/api/admin/console/…`` both come from here.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sluice.core.extensions import packs_on
from sluice.core.services import Services
from sluice.jobs.overdue import statuses
from sluice.jobs.registry import JOBS
from sluice.jobs.runs import RunStore
from sluice.ops.overview import _iso, _section
from sluice.store.db import utcnow
from sluice.store.history import HistoryStore, Sample

FIGURES = ("depth", "inFlight", "retrying", "dead", "oldestAgeS")
# The schedule samples once a minute; a duplicate delivery of the event (or a manual run)
# within this interval adds no second point.
SAMPLE_EVERY = timedelta(seconds=30)
WINDOWS: dict[str, timedelta] = {"24h": timedelta(hours=24), "7d": timedelta(days=7)}
RECENT_RUNS = 10


def _age_s(now: datetime, at: Any) -> float | None:
    if at is None:
        return None
    if isinstance(at, str):
        at = datetime.fromisoformat(at)
    age: float = round(max(0.0, (now - at).total_seconds()), 3)
    return age


def _card(key: str, title: str, kind: str, source: str, measured: Any, now: datetime,
          build: Callable[[Any], dict[str, Any]], *, link: str | None = None,
          note: str | None = None) -> dict[str, Any]:
    card: dict[str, Any] = {"key": key, "title": title, "kind": kind, "source": source,
                            "measuredAt": _iso(now), "link": link, "note": note,
                            "error": None, "figures": None, "notConfigured": None}
    if isinstance(measured, dict) and "notConfigured" in measured:
        # Not set up is a choice, not a failure: the card says so without alarm.
        card["notConfigured"] = measured["notConfigured"]
        return card
    if isinstance(measured, dict) and "error" in measured and "message" in measured:
        card["error"] = {"code": measured["error"], "message": measured["message"]}
        return card
    try:
        figures = build(measured)
    except Exception as exc:  # noqa: BLE001 - an unexpected shape is shown, not hidden
        card["error"] = {"code": type(exc).__name__, "message": str(exc)[:300]}
        return card
    card["figures"] = {name: figures.get(name) for name in FIGURES}
    return card


def _topic_cards(services: Services, cloudwatch: Any) -> list[dict[str, Any]]:
    from sluice.ops.overview import topic_figures
    from sluice.queues.deadletters import LocalDeadLetters
    from sluice.queues.topics import TOPICS

    measured = _section(lambda: topic_figures(services, cloudwatch=cloudwatch))
    now = utcnow()
    if isinstance(measured, dict):  # the whole source failed: one error card per queue
        return [card for topic in TOPICS for card in (
            _card(topic, topic, "topic", "queues", measured, now, dict),
            _card(f"{topic}-dlq", f"{topic}-dlq", "dlq", "queues", measured, now, dict))]
    cards = []
    for row in measured:
        topic, mode = row["topic"], row["mode"]
        link = f"/admin/dlq/{topic}"
        if mode == "local":
            cards.append(_card(topic, topic, "topic", "in process (SLUICE_QUEUE_MODE=local)",
                               {}, now, lambda m: {},
                               note="runs in process as it is published: no backlog"))

            def local_dlq(m: dict[str, Any], topic: str = topic) -> dict[str, Any]:
                oldest = None
                if m["depth"]:
                    rows = LocalDeadLetters(services.db).list(topic, 500)
                    if len(rows) == m["depth"]:
                        oldest = _age_s(now, min(r["failed_at"] for r in rows))
                return {"depth": m["depth"], "dead": m["depth"], "oldestAgeS": oldest}

            cards.append(_card(f"{topic}-dlq", f"{topic}-dlq", "dlq",
                               "queue_dead_letters table", row["dlq"], now, local_dlq, link=link))
            continue
        for kind, figures in (("topic", row["queue"]), ("dlq", row["dlq"])):
            name = figures.get("name") if isinstance(figures, dict) else None
            source = f"SQS {name or ''} + CloudWatch ApproximateAgeOfOldestMessage"

            def sqs(m: dict[str, Any], kind: str = kind) -> dict[str, Any]:
                depth = m["visible"] + m["inFlight"] + m["delayed"]
                return {"depth": depth, "inFlight": m["inFlight"], "retrying": m["delayed"],
                        "dead": depth if kind == "dlq" else None, "oldestAgeS": m["oldestAgeS"]}

            key = topic if kind == "topic" else f"{topic}-dlq"
            cards.append(_card(key, key, kind, source, figures, now, sqs,
                               link=link if kind == "dlq" else None))
    return cards


def _quarantine_card(services: Services) -> dict[str, Any]:
    from sluice.queues.deadletters import QUARANTINE, Quarantine

    def measure() -> dict[str, Any]:
        store = Quarantine(services.db)
        depth = store.count()
        oldest = None
        if depth:
            rows = store.list(500)
            if len(rows) == depth:
                oldest = min(r["received_at"] for r in rows)
        return {"depth": depth, "oldest": oldest}

    measured = _section(measure)
    now = utcnow()
    return _card(QUARANTINE, "Quarantine (rejected messages)", "dlq", "queue_quarantine table",
                 measured, now, lambda m: {"depth": m["depth"], "dead": m["depth"],
                                           "oldestAgeS": _age_s(now, m["oldest"])},
                 link=f"/admin/dlq/{QUARANTINE}",
                 note="malformed, unsigned or forged messages, kept as received")


def _delivery_alerts(services: Services, stats: Any) -> list[str]:
    """What needs an operator on the delivery card: destinations down, unknown outcomes."""
    from sluice.delivery.destinations import Destinations

    alerts = []
    down = _section(lambda: [d for d in Destinations(
        services.db, services.settings.delivery_outage_threshold).status() if d["down"]])
    for d in down if isinstance(down, list) else []:
        alerts.append(f"{d['key']} is down since {d['downSince']}: {d['waiting']} entries "
                      "waiting (no attempt counted)")
    unknown = stats.get("unknown", {}).get("count", 0) if isinstance(stats, dict) else 0
    if unknown:
        alerts.append(f"{unknown} entries sent without an answer rest unknown: mark them "
                      "delivered, send them again or purge them")
    return alerts


def overview(services: Services, *, cloudwatch: Any = None) -> dict[str, Any]:
    """Every queue's card, each measured on its own: the topics' and the quarantine, then
    those of the packs that are on (ledger, metering, delivery, erasure)."""
    started = utcnow()
    on = packs_on()
    cards = _topic_cards(services, cloudwatch)
    cards.append(_quarantine_card(services))
    if "ledger" in on or "metering" in on:
        cards += _usage_cards(services, on)
    if "delivery" in on:
        cards.append(_delivery_card(services))
    if "erasure" in on:
        cards.append(_erasure_card(services))
    return {"generatedAt": _iso(started), "cards": cards}


def _usage_cards(services: Services, on: tuple[str, ...]) -> list[dict[str, Any]]:
    from sluice.billing.usage import usage_figures

    usage = _section(lambda: usage_figures(services.db, services.redis))
    now = utcnow()
    ledger: Any
    outbox: Any
    if "error" in usage:
        ledger = outbox = usage
    else:
        ledger = usage["ledgerRetry"] or {"notConfigured": (
            "no Redis is configured (SLUICE_REDIS_URL or UPSTASH_REDIS_REST_URL): ledger "
            "writes go straight to the database and nothing can wait here")}
        outbox = usage["meteringOutbox"]
    cards = []
    if "ledger" in on:
        cards.append(_card("ledger", "AI ledger retry lists", "redis",
                           "Redis LLEN ai:ledger:retry:{queue,processing,dlq}", ledger, now,
                           lambda m: {"depth": m["queue"], "inFlight": m["processing"],
                                      "dead": m["dlq"]}, link="/admin/dlq/ledger"))
    if "metering" in on:
        cards.append(_card("metering", "Metering outbox", "table", "ai_usage_metering_outbox",
                           outbox, now,
                           lambda m: {"depth": m["pending"] + m["retrying"],
                                      "retrying": m["retrying"], "dead": m["exhausted"],
                                      "oldestAgeS": _age_s(now, m["oldestEligibleAt"])}))
    return cards


def _delivery_card(services: Services) -> dict[str, Any]:
    from sluice.delivery.store import DeliveryStore

    delivery = _section(lambda: DeliveryStore(services.db).stats())
    now = utcnow()
    card = _card("delivery", "Delivery queue", "table", "delivery_queue", delivery, now,
                 lambda m: {"depth": m["pending"]["count"],
                            "inFlight": m["in_flight"]["count"],
                            "dead": m["failed"]["count"],
                            "oldestAgeS": _age_s(now, m["pending"]["oldest"])},
                 link="/admin/deliveries")
    card["alerts"] = _delivery_alerts(services, delivery)
    return card


def _erasure_card(services: Services) -> dict[str, Any]:
    from sluice.erasure.requests import ErasureStore

    erasure = _section(lambda: ErasureStore(services.db).summary())
    return _card("erasure", "Erasure requests", "table", "data_erasure_requests", erasure,
                 utcnow(), lambda m: {"depth": m["byStatus"]["requested"],
                                      "retrying": m["due"],
                                      "dead": m["byStatus"]["failed"]},
                 link="/admin/erasure",
                 note="waiting: requested; due now: in the retrying column")


def record_depths(services: Services, data: dict[str, Any], *,
                  now: datetime | None = None) -> int:
    """One depth sample per measured card, at most once per ``SAMPLE_EVERY``."""
    now = now or utcnow()
    store = HistoryStore(services.db)
    last = store.latest_at("depth")
    if last is not None and now - last < SAMPLE_EVERY:
        return 0
    return store.add(Sample("depth", card["key"], now, float(card["figures"]["depth"]))
                     for card in data["cards"]
                     if card["figures"] and card["figures"]["depth"] is not None)


def _point(sample: Sample) -> dict[str, Any]:
    return {"at": _iso(sample.at), "value": sample.value, "outcome": sample.outcome}


def history(services: Services, *, now: datetime | None = None) -> dict[str, Any]:
    """Depth per queue over 24 h and 7 d, and every job's runs (duration, outcome) over 7 d."""
    now = now or utcnow()
    store = HistoryStore(services.db)
    week = store.series("depth", now - WINDOWS["7d"])
    depth = {window: {name: [_point(s) for s in samples if s.at >= now - span]
                      for name, samples in week.items()}
             for window, span in WINDOWS.items()}
    runs = store.series("job", now - WINDOWS["7d"])
    return {"generatedAt": _iso(now), "windows": {k: int(v.total_seconds())
                                                  for k, v in WINDOWS.items()},
            "depth": depth,
            "jobs": {name: [_point(s) for s in runs.get(name, [])] for name in JOBS}}


def job_run(services: Services, name: str, run_id: str) -> dict[str, Any]:
    """One handed-off run of job ``name``, by its request id: ``waiting`` until the job's
    function records it, then ``running``, then ended (the run's outcome and result)."""
    from sluice.core.validate import check_identifier
    from sluice.jobs.registry import get_job

    job = get_job(name)
    check_identifier(run_id, field="run_id", limit=128)
    row = RunStore(services.db).by_request(job.name, run_id)
    run = None if row is None else {
        "id": row["id"], "trigger": row["trigger"], "requestId": row["request_id"],
        "startedAt": _iso(row["started_at"]), "finishedAt": _iso(row["finished_at"]),
        "outcome": row["outcome"], "durationMs": row["duration_ms"], "result": row["result"]}
    state = "waiting" if run is None else "running" if run["outcome"] == "running" else "ended"
    return {"job": job, "name": job.name, "runId": run_id, "state": state, "run": run}


def jobs(services: Services, *, now: datetime | None = None) -> dict[str, Any]:
    """Each job: its schedule (from the job table), next run, last runs."""
    from sluice.jobs.schedule import job_schedules, parse

    now = now or utcnow()
    configured = job_schedules(JOBS)
    store = RunStore(services.db)
    states = statuses(services.db, now)
    rows = []
    for job in JOBS.values():
        expressions = configured[job.name]
        runs = store.recent(job.name, RECENT_RUNS)
        last = next((r["started_at"] for r in runs if r["trigger"] == "schedule"), None)
        next_runs = sorted(t for e in expressions
                           if (t := parse(e).next_run(now, last)) is not None)
        rows.append({
            "job": job.name, "route": job.route, "surface": job.surface,
            "schedule": expressions, "nextRunAt": _iso(next_runs[0]) if next_runs else None,
            **states[job.name],
            "runs": [{"id": r["id"], "startedAt": _iso(r["started_at"]),
                      "trigger": r["trigger"], "outcome": r["outcome"],
                      "durationMs": r["duration_ms"], "result": r["result"]} for r in runs],
        })
    return {"generatedAt": _iso(now), "jobs": rows}
