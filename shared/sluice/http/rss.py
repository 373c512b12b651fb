"""Admin API for RSS ingestion (surface ``ingestion``: roles super_admin, ops).

Sources (a feed URL with its fetch state), tenant scopes (a tenant's source set and
locale) and the stories of a scope's build, read without building. Every write is
audited by the app's middleware; the tick itself, ``/api/admin/rss/refresh``, comes
from the job registry.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse

from sluice.core.auth import Identity
from sluice.core.errors import RequestError
from sluice.core.query import QueryParam
from sluice.http.app import require, services_of
from sluice.http.models import FeedScope, FeedSource, request_body
from sluice.http.params import openapi_query
from sluice.rss.admin import MAX_STORIES, add_source, put_scope, scope_stories_body
from sluice.rss.store import RssStore

router = APIRouter(prefix="/api/admin/rss", tags=["rss"])
JSON_BODY = Body(...)


def _store(request: Request) -> RssStore:
    return RssStore(services_of(request).db)


def _only(request: Request, *allowed: str) -> None:
    """A query parameter the route does not honour is a 400, not silently ignored."""
    unknown = sorted(set(request.query_params) - set(allowed))
    if unknown:
        raise RequestError(f"unknown query parameter {unknown[0]}", field=unknown[0])


@router.post("/sources", name="rss:source_add", status_code=201,
             openapi_extra=request_body(FeedSource))
def create_source(request: Request, body: Any = JSON_BODY,
                  identity: Identity = require("ingestion")) -> dict[str, Any]:
    _only(request)
    return add_source(services_of(request), body).to_json()


@router.get("/sources", name="rss:source_list")
def list_sources(request: Request, identity: Identity = require("ingestion")) -> dict[str, Any]:
    _only(request)
    return {"sources": [s.to_json() for s in _store(request).sources()]}


@router.get("/sources/{source_id}", name="rss:source_show")
def show_source(request: Request, source_id: str,
                identity: Identity = require("ingestion")) -> dict[str, Any]:
    _only(request)
    return _store(request).source(source_id).to_json()


@router.delete("/sources/{source_id}", name="rss:source_remove")
def remove_source(request: Request, source_id: str,
                  identity: Identity = require("ingestion")) -> dict[str, Any]:
    """Delete a source and its stories (409 while a scope uses it)."""
    _only(request)
    _store(request).remove_source(source_id)
    return {"removed": source_id}


@router.put("/scopes/{scope_id}", name="rss:scope_set", openapi_extra=request_body(FeedScope))
def set_scope(request: Request, scope_id: str, body: Any = JSON_BODY,
              identity: Identity = require("ingestion")) -> dict[str, Any]:
    _only(request)
    return put_scope(services_of(request), scope_id, body).to_json()


@router.get("/scopes", name="rss:scope_list")
def list_scopes(request: Request, identity: Identity = require("ingestion")) -> dict[str, Any]:
    _only(request)
    return {"scopes": [s.to_json() for s in _store(request).scopes()]}


@router.get("/scopes/{scope_id}", name="rss:scope_show")
def show_scope(request: Request, scope_id: str,
               identity: Identity = require("ingestion")) -> dict[str, Any]:
    _only(request)
    return _store(request).scope(scope_id).to_json()


@router.delete("/scopes/{scope_id}", name="rss:scope_remove")
def remove_scope(request: Request, scope_id: str,
                 identity: Identity = require("ingestion")) -> dict[str, Any]:
    _only(request)
    _store(request).remove_scope(scope_id)
    return {"removed": scope_id}


@router.get("/scopes/{scope_id}/stories", name="rss:scope_stories",
            openapi_extra=openapi_query([QueryParam("limit", "integer", 1, MAX_STORIES)]))
def scope_stories(request: Request, scope_id: str, identity: Identity = require("ingestion"),
                  ) -> JSONResponse:
    """The stories of the scope's stored build; never builds (``builtAt`` null: none yet)."""
    _only(request, "limit")
    return JSONResponse(scope_stories_body(services_of(request), scope_id,
                                     request.query_params.get("limit")))

