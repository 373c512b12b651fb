"""An OpenTelemetry collector stand-in: OTLP/HTTP on 127.0.0.1, each export decoded with the
protocol's own protobuf definitions (``opentelemetry-proto``), as a collector reads it.

``spans`` keeps every span received (flattened, with its resource's ``service.name``);
``metrics`` every metric point's name. ``answers`` scripts statuses (a 503 the exporter
retries or drops), like the other stand-ins.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tests.providers.http import ProviderServer, StandIn

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer",
         5: "consumer"}


def value_of(value: AnyValue) -> Any:
    field = value.WhichOneof("value")
    return getattr(value, field) if field else None


def attributes_of(pairs: Any) -> dict[str, Any]:
    return {pair.key: value_of(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


class Link(NamedTuple):
    trace_id: str
    span_id: str
    attributes: dict[str, Any]


class ReceivedSpan(NamedTuple):
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: list[Link]
    status: int  # 0 unset, 1 ok, 2 error
    service: str


class OtlpReceiver(StandIn):
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.metrics: dict[str, list[Any]] = {}
        self.exports = 0
        self._lock = threading.Lock()
        self.http = ProviderServer(self._handle)

    def _handle(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        if method != "POST" or headers.get("content-type") != "application/x-protobuf":
            return 415, {}, b""
        if headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if path == "/v1/traces":
            traces = ExportTraceServiceRequest.FromString(body)
            with self._lock:
                self.exports += 1
                self.spans += _spans(traces)
            return 200, {"content-type": "application/x-protobuf"}, b""
        if path == "/v1/metrics":
            metrics = ExportMetricsServiceRequest.FromString(body)
            with self._lock:
                for resource in metrics.resource_metrics:
                    for scope in resource.scope_metrics:
                        for metric in scope.metrics:
                            self.metrics.setdefault(metric.name, []).append(metric)
            return 200, {"content-type": "application/x-protobuf"}, b""
        return 404, {}, b""

    def named(self, prefix: str) -> list[ReceivedSpan]:
        return [span for span in self.spans if span.name.startswith(prefix)]


def _spans(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    found = []
    for resource in request.resource_spans:
        service = str(attributes_of(resource.resource.attributes).get("service.name"))
        for scope in resource.scope_spans:
            for span in scope.spans:
                found.append(ReceivedSpan(
                    span.name, KINDS[span.kind], span.trace_id.hex(), span.span_id.hex(),
                    span.parent_span_id.hex(), span.start_time_unix_nano,
                    span.end_time_unix_nano, attributes_of(span.attributes),
                    [Link(link.trace_id.hex(), link.span_id.hex(),
                          attributes_of(link.attributes)) for link in span.links],
                    span.status.code, service))
    return found


@contextmanager
def exporting() -> Iterator[OtlpReceiver]:
    """Telemetry on (``sluice.core.trace``), exporting to a local collector; off again
    after."""
    from sluice.core import trace

    with OtlpReceiver() as receiver:
        assert trace.configure({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
        try:
            yield receiver
        finally:
            trace.flush()
            trace.configure({})
