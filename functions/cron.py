"""Scheduled functions: the packaged handler, ``sluice.lambda_handlers.cron``."""

from __future__ import annotations

from sluice.lambda_handlers.cron import JOB, SERVICES, JobErrored, handler

__all__ = ["JOB", "SERVICES", "JobErrored", "handler"]
