"""Telemetry off costs nothing: with no OTLP endpoint (or ``OTEL_SDK_DISABLED=true``, or
the extra missing), a function's whole path runs without importing ``opentelemetry`` (the
extra is installed here: only the decision keeps it out), and the work is unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import BASE_ENV, ROOT

# A cron function's cold start and run (the delivery drain), then a publish consumed in
# process and an enqueue: what telemetry would wrap, each once.
SCRIPT = """
import json, sys
from sluice.lambda_handlers import cron
from tests.lambda_context import LambdaContext
event = json.load(open("tests/events/scheduled_event.json"))
answer = cron.handler(event, LambdaContext())
from sluice.delivery.store import DeliveryStore
from sluice.queues.publish import Publisher
from sluice.queues.runtime import consumers_for
consumers_for(cron.SERVICES)
published = Publisher(cron.SERVICES.settings).publish("rss.ingest", {"batchId": "b-1"})
entry, _ = DeliveryStore(cron.SERVICES.db).enqueue("webhook", "https://example.com/h", {"x": 1})
print(json.dumps({"outcome": answer["outcome"], "published": published.outcome,
                  "traceContext": entry.trace_context,
                  "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry"))}))
"""


def _run(sqlite_url: str, **otel: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLUICE_", "CRON_", "AWS_", "OTEL_"))}
    env.update({**BASE_ENV, "SLUICE_DATABASE_URL": sqlite_url, "SLUICE_JOB": "delivery-drain",
                "SLUICE_QUEUE_SIGNING_SECRET": "signing-secret-for-tests-0123456789",
                "AWS_ENDPOINT_URL": "http://127.0.0.1:9", **otel})
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    result["stderr"] = done.stderr
    return result


@pytest.mark.parametrize("otel", [
    {},
    {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
    {"OTEL_SERVICE_NAME": "sluice-prod", "OTEL_EXPORTER_OTLP_HEADERS": "x=1"},
], ids=["no-endpoint", "sdk-disabled", "no-endpoint-other-variables"])
def test_off_imports_nothing_and_changes_nothing(sqlite_url: str, otel: dict[str, str]) -> None:
    result = _run(sqlite_url, **otel)
    del result["stderr"]
    assert result == {"outcome": "ok", "published": "done", "traceContext": None, "otel": []}


def test_an_endpoint_without_the_extra_runs_without_telemetry_and_says_so(
        sqlite_url: str) -> None:
    # the extra "missing": its import fails, as it would without the packages
    script_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                  "PYTHONPATH": str(ROOT / "tests" / "integration" / "core" / "no_otel")}
    result = _run(sqlite_url, **script_env)
    assert result["outcome"] == "ok" and result["traceContext"] is None
    assert "OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed" in str(
        result["stderr"])


def test_an_endpoint_turns_it_on_at_cold_start(sqlite_url: str) -> None:
    result = _run(sqlite_url, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
                  OTEL_BSP_EXPORT_TIMEOUT="100", OTEL_EXPORTER_OTLP_TIMEOUT="1")
    assert result["outcome"] == "ok"
    assert "opentelemetry.sdk.trace" in result["otel"]  # type: ignore[operator]
    assert json.loads(str(result["traceContext"]))["traceparent"].startswith("00-")
