"""The HTTP function: the FastAPI app behind Mangum (lifespan off)."""

from __future__ import annotations

from mangum import Mangum

from shared.http_app import create_app
from shared.services import Services

app = create_app(Services.from_env())
handler = Mangum(app, lifespan="off")
