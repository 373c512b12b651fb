"""The HTTP function: the FastAPI app behind Mangum (lifespan off)."""

from __future__ import annotations

from sluice.lambda_handlers import cold_start

with cold_start():
    from mangum import Mangum

    from sluice.core.services import Services
    from sluice.http.app import create_app

    app = create_app(Services.from_env())
    handler = Mangum(app, lifespan="off")
