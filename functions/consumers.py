"""SQS-triggered consumers: the packaged handler, ``sluice.lambda_handlers.consumers``."""

from __future__ import annotations

from sluice.lambda_handlers.consumers import CONSUMER, SERVICES, TOPIC, handler

__all__ = ["CONSUMER", "SERVICES", "TOPIC", "handler"]
