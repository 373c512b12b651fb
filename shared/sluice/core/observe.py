"""Reports: structured logs (Powertools Logger), metrics (Powertools Metrics, EMF; the
same figures as OpenTelemetry metrics when ``sluice.core.trace`` is on) and, when ``SENTRY_DSN`` is set, Sentry errors and cron check-ins.

Logs and metric blobs go to stderr outside Lambda so that ``sluice run --json``
keeps stdout for the result alone; Lambda ships both streams to CloudWatch.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from sluice.core import trace

SERVICE = "sluice"
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message"}
NAMESPACE = "Sluice"

logger = Logger(service=SERVICE, logger_handler=logging.StreamHandler(sys.stderr))
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)
# The command line keeps stderr clean for scripts: metric blobs only when asked (-v).
_metrics_quiet = False


def quiet_metrics(quiet: bool) -> None:
    global _metrics_quiet
    _metrics_quiet = quiet


def metrics_quiet() -> bool:
    return _metrics_quiet


def _in_lambda() -> bool:
    return bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME"))


class Reporter:
    """Where errors, drain failures, metrics and check-ins go."""

    def __init__(self, *, sentry_dsn: str | None = None, environment: str = "dev") -> None:
        self.sentry = False
        if sentry_dsn:
            import sentry_sdk

            sentry_sdk.init(dsn=sentry_dsn, environment=environment, traces_sample_rate=0.0,
                            default_integrations=False)
            self.sentry = True

    def error(self, context: str, exc: BaseException | None = None, **extra: Any) -> None:
        # "message" and the other LogRecord attributes cannot be passed as extra fields.
        fields = {(f"detail_{k}" if k in _RESERVED else k): v for k, v in extra.items()}
        logger.error(f"[{context}] {exc if exc is not None else extra.get('message', '')}",
                     extra={"context": context, **fields}, exc_info=exc)
        self.metric("Errors", 1, context=context)
        if self.sentry:
            import sentry_sdk

            with sentry_sdk.new_scope() as scope:
                scope.set_tag("context", context)
                for key, value in extra.items():
                    scope.set_extra(key, value)
                if exc is not None:
                    sentry_sdk.capture_exception(exc)
                else:
                    sentry_sdk.capture_message(f"[{context}] {extra.get('message', 'error')}",
                                               level="error")

    def drain_failures(self, job: str, failed: int, result: dict[str, Any]) -> None:
        """A drain reported failures > 0: durable, so not fatal, but never silent."""
        logger.error(f"[{job}] drain reported {failed} failure(s)",
                     extra={"job": job, "failed": failed, "result": result})
        self.metric("DrainFailures", failed, job=job)
        if self.sentry:
            import sentry_sdk

            with sentry_sdk.new_scope() as scope:
                scope.set_tag("job", job)
                scope.set_extra("result", result)
                sentry_sdk.capture_message(f"[{job}] drain reported {failed} failure(s)",
                                           level="error")

    def metric(self, name: str, value: float, unit: str = "Count", **dimensions: str) -> None:
        metrics.add_metric(name=name, unit=MetricUnit(unit), value=value)
        for key, dim in dimensions.items():
            metrics.add_dimension(name=key, value=dim)
        self.flush()
        trace.record(name, value, unit, dimensions)

    def metrics(self, values: dict[str, float], unit: str = "Count", **dimensions: str) -> None:
        """Several metrics in one blob (one EMF record), sharing ``dimensions``."""
        for name, value in values.items():
            metrics.add_metric(name=name, unit=MetricUnit(unit), value=value)
        for key, dim in dimensions.items():
            metrics.add_dimension(name=key, value=dim)
        self.flush()
        for name, value in values.items():
            trace.record(name, value, unit, dimensions)

    def checkin(self, job: str, status: str, *, check_in_id: str | None = None,
                duration_s: float | None = None,
                monitor_config: Callable[[], Mapping[str, Any]] | None = None) -> str | None:
        """A Sentry cron check-in (``in_progress``, then ``ok`` or ``error``), carrying the
        monitor's config (``monitor_config``, called only when Sentry is on) so Sentry
        creates the monitor from it."""
        if not self.sentry:
            return None
        from sentry_sdk.crons import capture_checkin

        config = dict(monitor_config()) if monitor_config is not None else None
        result: str | None = capture_checkin(monitor_slug=job, check_in_id=check_in_id,
                                             status=status, duration=duration_s,
                                             monitor_config=config)  # type: ignore[arg-type]
        return result

    def flush(self) -> None:
        if not metrics.metric_set:
            return
        blob = json.dumps(metrics.serialize_metric_set(), separators=(",", ":"))
        if _in_lambda():
            sys.stdout.write(blob + "\n")
        elif not _metrics_quiet:
            sys.stderr.write(blob + "\n")
        metrics.clear_metrics()
