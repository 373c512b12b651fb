"""``/api/docs``: Swagger UI served from the assets the ``fastapi-offline`` package ships.

Nothing loads from outside: the page, Swagger UI's script and stylesheet, and the script
that starts it all come from this app, under a CSP as strict as the console's (Swagger UI
needs ``data:`` images for its icons; it sets styles through the DOM, which the CSP allows).
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from sluice.core.errors import NotFound

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
