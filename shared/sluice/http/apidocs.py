"""``/api/docs``: Swagger UI served from the assets the ``fastapi-offline`` package ships.

Nothing loads from outside: the page, Swagger UI's script and stylesheet, and the script
that starts it all come from this app, under a CSP as strict as the console's (Swagger UI
needs ``data:`` images for its icons; it sets styles through the DOM, which the CSP allows).
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel

from sluice.core.errors import NotFound
from sluice.http.models import BODIES, ErrorBody

router = APIRouter(include_in_schema=False)

DOCS = "/api/docs"
OPENAPI = "/api/openapi.json"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
       "form-action 'none'")
HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff",
           "referrer-policy": "no-referrer", "cache-control": "no-cache"}
# Swagger UI 5 (it reads OpenAPI 3.1, which FastAPI writes): the files of the bundle the
# page uses, and their types (any other name is a 404).
BUNDLE = files("fastapi_offline") / "static"
ASSETS = {"swagger-ui.css": "text/css; charset=utf-8",
          "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
          "favicon.png": "image/png"}
PAGE = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Sluice API</title>
<link rel="stylesheet" href="{DOCS}/assets/swagger-ui.css">
<link rel="icon" type="image/png" href="{DOCS}/assets/favicon.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{DOCS}/assets/swagger-ui-bundle.js"></script>
<script src="{DOCS}/assets/start.js"></script>
</body>
</html>
"""
START = f"""window.ui = SwaggerUIBundle({{
  url: "{OPENAPI}",
  dom_id: "#swagger-ui",
  deepLinking: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout"
}});
"""


@router.get(DOCS)
def docs_page() -> HTMLResponse:
    return HTMLResponse(PAGE, headers=HEADERS)


@router.get(DOCS + "/assets/{name}")
def docs_asset(name: str) -> Response:
    if name == "start.js":
        return Response(START, media_type="text/javascript; charset=utf-8", headers=HEADERS)
    if name not in ASSETS:
        raise NotFound(f"no API docs asset {name!r}")
    return Response((BUNDLE / name).read_bytes(), media_type=ASSETS[name],
                    headers={**HEADERS, "cache-control": "public, max-age=86400"})


_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
# The refusals every route may answer, and those of a route that authenticates its caller.
ERRORS = {"400": "the input was refused (error.field names it)",
          "503": "a store or a service Sluice depends on did not answer; try again later"}
AUTH_ERRORS = {"401": "no credentials, or wrong ones", "403": "this identity may not do that"}


def describe(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document: FastAPI's, with the bodies the door reads, the error body of
    every refusal, and the security schemes the routes declare (admin JWT, cron bearer)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                         description="Sluice's HTTP API: cron routes (the cron bearer), "
                                     "admin routes (an admin JWT with roles).")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    models: list[type[BaseModel]] = [*BODIES.values(), ErrorBody]
    for model in models:
        found = model.model_json_schema(ref_template="#/components/schemas/{model}",
                                        by_alias=True)
        components.update(found.pop("$defs", {}))
        components[model.__name__] = found
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            body = operation.pop("x-sluice-body", None)
            if body is not None:  # the route's body as its model describes it
                operation["requestBody"] = {
                    "required": body["required"], "content": {"application/json": {
                        "schema": {"$ref": f"#/components/schemas/{body['model']}"}}}}
            responses = operation.setdefault("responses", {})
            codes = {**ERRORS, **(AUTH_ERRORS if operation.get("security") else {})}
            for code, text in codes.items():
                responses.setdefault(code, {"description": text, **_ERROR})
    app.openapi_schema = schema
    return schema
