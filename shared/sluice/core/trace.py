"""OpenTelemetry traces and metrics, optional and free when off.

The only module that imports ``opentelemetry``. Telemetry is on when an OTLP endpoint is
configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``),
``OTEL_SDK_DISABLED`` is not ``true`` and the ``otel`` extra is installed; otherwise
:func:`span` hands back one shared object that does nothing, and nothing from
``opentelemetry`` is ever imported (a function's cold start is what it was).

When on, spans and metrics go over OTLP/HTTP (protobuf) to that endpoint, through a
tracer provider set up here, or through the one the process already has (the ADOT Lambda
layer's). Work carries its context as a W3C trace context *carrier* (``traceparent``,
``tracestate``): in an SQS message's attributes, and stored with a delivery entry, so
the consumer and every later send attempt join the trace of the code that produced it.
Which spans there are, and what each attribute means: docs/observability.md.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self

if TYPE_CHECKING:
    from types import TracebackType

Kind = Literal["internal", "producer", "consumer", "client", "server"]
Carrier = Mapping[str, str]
AttributeValue = str | int | float | bool
# The messaging system named in ``messaging.system`` of Sluice's own queues.
SYSTEM_SQS = "aws_sqs"
SYSTEM_SLUICE = "sluice"
# EMF figures that are a state, not a count of events: OpenTelemetry gauges.
GAUGES = frozenset({"QueueDrained.destinationsDown", "QueueDrained.destinationsDisabled",
                    "QueueDrained.leftDue", "QueueDrained.deferredBackoff"})


class Span(Protocol):
    def set(self, key: str, value: AttributeValue | None) -> None: ...

    def rename(self, name: str) -> None: ...


class _Off:
    """The span, and its context manager, when telemetry is off: one shared object."""

    __slots__ = ()

    def set(self, key: str, value: AttributeValue | None) -> None:
        return None

    def rename(self, name: str) -> None:
        return None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None


OFF = _Off()


def _enabled_by(environ: Mapping[str, str]) -> str | None:
    """The variable that turns telemetry on, or None when the environment leaves it off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        if environ.get(name, "").strip():
            return name
    return None


def _endpoint(environ: Mapping[str, str], signal: str) -> str:
    own = environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "").strip()
    if own:
        return own
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if not base:  # only the traces endpoint is set: metrics go beside it
        base = environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].strip().removesuffix("/v1/traces")
    return f"{base.rstrip('/')}/v1/{signal}"


def metric_name(emf: str) -> str:
    """An EMF figure's name as OpenTelemetry's (instrument names are case-insensitive):
    ``QueueDrained.destinationsDown`` -> ``sluice.queue_drained.destinations_down``."""
    return "sluice." + ".".join(re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", part).lower()
                                for part in emf.split("."))


class _On:
    """Telemetry on: the tracer, the meter and the instruments made so far."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        from opentelemetry import metrics as metrics_api
        from opentelemetry import trace as trace_api
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.api = trace_api
        self.propagator = TraceContextTextMapPropagator()
        attributes: dict[str, str] = {}
        if not environ.get("OTEL_SERVICE_NAME"):
            attributes["service.name"] = "sluice"
        if environ.get("AWS_LAMBDA_FUNCTION_NAME"):
            attributes["faas.name"] = environ["AWS_LAMBDA_FUNCTION_NAME"]
        resource = Resource.create(attributes)
        self.owned: list[Any] = []  # the providers set up here (flushed, shut down)
        # the providers the process already has (the ADOT layer's), else Sluice's own
        tracers: Any = trace_api.get_tracer_provider()
        if not isinstance(tracers, TracerProvider):
            tracers = TracerProvider(resource=resource)
            tracers.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=_endpoint(environ, "traces"))))
            self.owned.append(tracers)
        meters: Any = metrics_api.get_meter_provider()
        if not isinstance(meters, MeterProvider):
            reader = PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=_endpoint(environ, "metrics")))
            meters = MeterProvider(metric_readers=[reader], resource=resource)
            self.owned.append(meters)
        self.providers = (tracers, meters)
        self.tracer = tracers.get_tracer("sluice")
        self.meter = meters.get_meter("sluice")
        self.instruments: dict[str, Any] = {}
        self.kinds = {"internal": trace_api.SpanKind.INTERNAL,
                      "producer": trace_api.SpanKind.PRODUCER,
                      "consumer": trace_api.SpanKind.CONSUMER,
                      "client": trace_api.SpanKind.CLIENT,
                      "server": trace_api.SpanKind.SERVER}

    def context(self, carrier: Carrier) -> Any:
        return self.propagator.extract(dict(carrier))

    def span_context(self, carrier: Carrier) -> Any:
        found = self.api.get_current_span(self.context(carrier)).get_span_context()
        return found if found.is_valid else None

    @contextmanager
    def span(self, name: str, kind: Kind, attributes: Mapping[str, AttributeValue | None],
             parent: Carrier | None, links: Mapping[str, Carrier | None]) -> Iterator[Span]:
        from opentelemetry.trace import Link

        context = self.context(parent) if parent else None
        if context is not None and self.span_context(parent or {}) is None:
            context = None  # an unreadable carrier: the current span stays the parent
        linked = []
        for why, carrier in links.items():
            found = self.span_context(carrier) if carrier else None
            if found is not None:
                linked.append(Link(found, {"sluice.link": why}))
        with self.tracer.start_as_current_span(
                name, context=context, kind=self.kinds[kind], links=linked,
                attributes={k: v for k, v in attributes.items() if v is not None}) as live:
            yield _Live(live)

    def carrier(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier)
        return carrier

    def record(self, name: str, value: float, unit: str,
               dimensions: Mapping[str, str]) -> None:
        instrument = self.instruments.get(name)
        if instrument is None:
            metric, otel_unit = metric_name(name), {"Milliseconds": "ms", "Count": "1"}.get(
                unit, unit)
            if name in GAUGES:
                instrument = self.meter.create_gauge(metric, unit=otel_unit)
            elif unit == "Milliseconds":
                instrument = self.meter.create_histogram(metric, unit=otel_unit)
            else:
                instrument = self.meter.create_counter(metric, unit=otel_unit)
            self.instruments[name] = instrument
        if hasattr(instrument, "add"):
            if value:  # a counter only grows; a zero adds nothing
                instrument.add(value, dict(dimensions))
        elif hasattr(instrument, "set"):
            instrument.set(value, dict(dimensions))
        else:
            instrument.record(value, dict(dimensions))

    def flush(self) -> None:
        for provider in self.providers:
            force_flush = getattr(provider, "force_flush", None)
            if force_flush is not None:
                force_flush()

    def shutdown(self) -> None:
        for provider in self.owned:
            provider.shutdown()


class _Live:
    __slots__ = ("span",)

    def __init__(self, span: Any) -> None:
        self.span = span

    def set(self, key: str, value: AttributeValue | None) -> None:
        if value is not None:
            self.span.set_attribute(key, value)

    def rename(self, name: str) -> None:
        self.span.update_name(name)


_UNSET: Any = object()
_state: _On | None = _UNSET


def configure(environ: Mapping[str, str] | None = None) -> bool:
    """Decide, once per process, whether telemetry is on (Lambda handlers call it at
    init; otherwise the first span does); True when it is."""
    global _state
    environ = os.environ if environ is None else environ
    if _state is not _UNSET and _state is not None:
        _state.shutdown()
    _state = None
    if _enabled_by(environ) is None:
        return False
    try:
        _state = _On(environ)
    except ImportError as exc:  # an endpoint but no extra: say so once, run without
        logging.getLogger(__name__).warning(f"{_enabled_by(environ)} is set but OpenTelemetry is not installed "
                       f"(pip install 'sluice-lambda[otel]', or the ADOT layer): no traces "
                       f"({exc})")
    return _state is not None


def _current() -> _On | None:
    if _state is _UNSET:
        configure()
    return _state


def enabled() -> bool:
    return _current() is not None


def span(name: str, *, kind: Kind = "internal",
         attributes: Mapping[str, AttributeValue | None] | None = None,
         parent: Carrier | None = None,
         links: Mapping[str, Carrier | None] | None = None) -> AbstractContextManager[Span]:
    """A span around the ``with`` block, current inside it; an exception leaving the block
    is recorded on it. ``parent``: a carrier whose span becomes the parent (else the
    current span); ``links``: carriers linked to, by why (``{"enqueue": carrier}``).
    Attributes that are None are left out."""
    state = _state if _state is not _UNSET else _current()
    if state is None:
        return OFF
    return state.span(name, kind, attributes or {}, parent, links or {})


def carrier() -> dict[str, str]:
    """The current span's context as a W3C carrier; empty when off or outside a span."""
    state = _state if _state is not _UNSET else _current()
    return {} if state is None else state.carrier()


def stored() -> str | None:
    """:func:`carrier` as the text a row keeps (None when there is none)."""
    found = carrier()
    return json.dumps(found, separators=(",", ":"), sort_keys=True) if found else None


def loaded(text: str | None) -> dict[str, str] | None:
    """A carrier a row kept (:func:`stored`), or None when it kept none or an unreadable one."""
    if not text:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    return {str(k): str(v) for k, v in found.items() if isinstance(v, str)}


def record(name: str, value: float, unit: str, dimensions: Mapping[str, str]) -> None:
    """An EMF figure (``sluice.core.observe``) as an OpenTelemetry metric, when on."""
    state = _state if _state is not _UNSET else _current()
    if state is not None:
        state.record(name, value, unit, dimensions)


def flush() -> None:
    """Export what is buffered: at the end of every invocation (Lambda freezes the
    process between them, and a batch left in memory may never leave)."""
    if _state is not _UNSET and _state is not None:
        _state.flush()


__all__ = ["OFF", "Carrier", "Span", "carrier", "configure", "enabled", "flush", "loaded",
           "record", "span", "stored"]
