"""The HTTP function: the packaged handler, ``sluice.lambda_handlers.http``."""

from __future__ import annotations

from sluice.lambda_handlers.http import app, handler

__all__ = ["app", "handler"]
