"""The HTTP function: the FastAPI app behind Mangum (lifespan off)."""

from __future__ import annotations

from sluice.lambda_handlers import cold_start

with cold_start():
    from typing import Any

    from mangum import Mangum

    from sluice.core import trace
    from sluice.core.services import Services
    from sluice.http.app import create_app

    app = create_app(Services.from_env())
    _mangum = Mangum(app, lifespan="off")


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Mangum's answer; what telemetry buffered is exported before it (an operator's
    action is a span)."""
    try:
        answer: dict[str, Any] = _mangum(event, context)
        return answer
    finally:
        trace.flush()
