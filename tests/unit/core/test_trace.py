"""sluice.core.trace's decisions: when telemetry is on, the metric names, the stored
carrier, the tracer provider it uses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sluice.core import trace
from sluice.core.trace import OFF, _enabled_by, loaded, metric_name
from tests.conftest import ROOT


@pytest.mark.parametrize(("environ", "by"), [
    ({}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"},
     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "false"},
     "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318/v1/metrics"}, None),
])
def test_on_only_with_an_endpoint_and_not_disabled(environ: dict[str, str],
                                                   by: str | None) -> None:
    assert _enabled_by(environ) == by


def test_off_hands_back_one_object_that_does_nothing() -> None:
    trace.configure({})
    try:
        with trace.span("job x", attributes={"sluice.job": "x"}) as span:
            span.set("sluice.outcome", "ok")
            span.rename("job y")
            assert span is OFF
            assert trace.carrier() == {} and trace.stored() is None
        trace.record("Errors", 1, "Count", {})
        trace.flush()
        assert not trace.enabled()
    finally:
        trace.configure({})


def test_emf_names_become_opentelemetry_names() -> None:
    assert metric_name("QueueDrained.destinationsDown") == "sluice.queue_drained.destinations_down"
    assert metric_name("JobDurationMs") == "sluice.job_duration_ms"
    assert metric_name("QueueOutageWaits") == "sluice.queue_outage_waits"


@pytest.mark.parametrize(("text", "carrier"), [
    (None, None), ("", None), ("not json", None), ("[1]", None),
    ('{"traceparent":"00-ab-cd-01"}', {"traceparent": "00-ab-cd-01"}),
    ('{"traceparent":"00-ab-cd-01","x":3}', {"traceparent": "00-ab-cd-01"}),
])
def test_a_stored_carrier_is_read_back_or_ignored(text: str | None,
                                                  carrier: dict[str, str] | None) -> None:
    assert loaded(text) == carrier


# A process whose tracer provider was set up before Sluice's (the ADOT layer's wrapper does
# so before the handler module is imported).
ADOPTED = """
import json
from opentelemetry import trace as api
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sluice.core import trace
memory = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))
api.set_tracer_provider(provider)
assert trace.configure({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
with trace.span("job x", attributes={"sluice.job": "x"}):
    pass
print(json.dumps([(s.name, dict(s.attributes)) for s in memory.get_finished_spans()]))
"""


def test_a_tracer_provider_already_set_up_is_the_one_used() -> None:
    done = subprocess.run([sys.executable, "-c", ADOPTED], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [["job x", {"sluice.job": "x"}]]
