"""History samples on both backends: console reads sample depths (at most once a minute),
job runs sample outcome and duration, the series cover 24 h and 7 d, state-cleanup prunes."""

from __future__ import annotations

from datetime import timedelta

from sluice.core.services import Services
from sluice.jobs.cleanup import cleanup_state
from sluice.jobs.registry import Deadline, get_job
from sluice.jobs.runner import run_job
from sluice.ops import console
from sluice.queues.deadletters import LocalDeadLetters
from sluice.store.db import utcnow
from sluice.store.history import HistoryStore, Sample


def test_depths_are_sampled_on_the_schedule_not_by_reading_the_console(
        services: Services) -> None:
    from fastapi.testclient import TestClient

    from sluice.http.app import create_app
    from tests.conftest import admin_token

    LocalDeadLetters(services.db).add("rss.enrich", {"errorMessage": "x"})
    client = TestClient(create_app(services))
    client.cookies.set("__session", admin_token(["ops"]))
    assert client.get("/admin/queues").status_code == 200
    assert HistoryStore(services.db).latest_at("depth") is None, "reading writes nothing"

    now = utcnow()
    sampled = run_job(get_job("history-sample"), services, "schedule")
    assert sampled.outcome == "ok", sampled.body
    written = sampled.body["sampled"]
    data = console.overview(services)
    measured = [c for c in data["cards"] if c["figures"] and c["figures"]["depth"] is not None]
    assert written == len(measured) > 0
    assert console.record_depths(services, data, now=utcnow() + timedelta(seconds=10)) == 0, \
        "a duplicate delivery of the event adds no second point"
    assert console.record_depths(services, data, now=now + timedelta(seconds=61)) == written
    history = console.history(services, now=now + timedelta(seconds=62))
    assert [p["value"] for p in history["depth"]["24h"]["rss.enrich-dlq"]] == [1.0, 1.0]
    assert "rss.enrich" not in history["depth"]["24h"], "no backlog in process: not sampled"


def test_windows_and_job_samples(services: Services) -> None:
    now = utcnow()
    store = HistoryStore(services.db)
    store.add([Sample("depth", "delivery", now - timedelta(hours=30), 4.0),
               Sample("depth", "delivery", now - timedelta(hours=2), 7.0),
               Sample("depth", "delivery", now - timedelta(days=9), 9.0)])
    run_job(get_job("state-cleanup"), services, "cli")
    history = console.history(services, now=utcnow())
    assert [p["value"] for p in history["depth"]["24h"]["delivery"]] == [7.0]
    assert [p["value"] for p in history["depth"]["7d"]["delivery"]] == [4.0, 7.0]
    [run] = history["jobs"]["state-cleanup"]
    assert run["outcome"] == "ok" and run["value"] is not None and run["value"] >= 0
    assert history["jobs"]["metering-flush"] == []


def test_state_cleanup_prunes_old_samples(services: Services) -> None:
    now = utcnow()
    store = HistoryStore(services.db)
    store.add([Sample("depth", "q", now - timedelta(days=9, minutes=i), 1.0) for i in range(5)]
              + [Sample("job", "state-cleanup", now - timedelta(days=1), 12.0, "ok")])
    result = cleanup_state(services.db, now=now, deadline=Deadline(60), batch_size=2)
    assert result["deletedSamples"] == 5
    assert store.series("depth", now - timedelta(days=30)) == {}
    assert len(store.series("job", now - timedelta(days=30))["state-cleanup"]) == 1
