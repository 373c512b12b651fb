"""Admin API for flags (the ``flags`` surface) and dead letters (the ``queues`` surface).

PUT and POST here are audited by the app's middleware like every admin write;
redrive and purge also write their own audit row with what they touched.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request

from sluice.core.auth import Identity
from sluice.core.errors import RequestError
from sluice.http.app import preview, require, services_of
from sluice.http.models import DeadLetterPurge, DeadLetterRedrive, FlagChange, request_body
from sluice.http.params import known_fields
from sluice.ops.deadletters import DEFAULT_REDRIVE, DeadLetters
from sluice.rss.store import RssStore
from sluice.store.flags import FLAG_ACTION, FlagStore

router = APIRouter()
REDRIVE_FIELDS = ("ids", "limit", "dryRun")
PURGE_FIELDS = ("ids", "all")
JsonBody = Annotated[dict[str, Any] | None, Body()]


def _ids(body: dict[str, Any]) -> list[str] | None:
    ids = body.get("ids")
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise RequestError("ids must be a list of strings")
    return list(ids)


@router.get("/api/admin/flags", name="flags:list")
def list_flags(request: Request, identity: Identity = require("flags")) -> dict[str, Any]:
    return {"flags": FlagStore(services_of(request).state).all()}


@router.put("/api/admin/flags", name=FLAG_ACTION, openapi_extra=request_body(FlagChange))
def set_flag(request: Request, body: Annotated[dict[str, Any], Body()],
             identity: Identity = require("flags")) -> dict[str, Any]:
    services = services_of(request)
    flags = FlagStore(services.state, scope_exists=RssStore(services.db).has_scope)
    return {"flag": flags.apply(body, actor=identity.subject)}


@router.get("/api/admin/dlq", name="dlq:overview")
def dlq_overview(request: Request, identity: Identity = require("queues")) -> dict[str, Any]:
    return {"queues": DeadLetters(services_of(request)).overview()}


@router.get("/api/admin/dlq/{name}", name="dlq:list")
def dlq_list(request: Request, name: str, limit: int = Query(50, ge=1, le=500),
             identity: Identity = require("queues")) -> dict[str, Any]:
    return DeadLetters(services_of(request)).list_letters(name, limit)


@router.get("/api/admin/dlq/{name}/{entry_id}", name="dlq:show")
def dlq_show(request: Request, name: str, entry_id: str,
             identity: Identity = require("queues")) -> dict[str, Any]:
    return DeadLetters(services_of(request)).show(name, entry_id)


@router.post("/api/admin/dlq/{name}/redrive", name="dlq:redrive",
             openapi_extra=request_body(DeadLetterRedrive, required=False))
def dlq_redrive(request: Request, name: str, body: JsonBody = None,
                identity: Identity = require("queues")) -> dict[str, Any]:
    body = body or {}
    known_fields(body, REDRIVE_FIELDS)
    limit = body.get("limit", DEFAULT_REDRIVE)
    dry_run = body.get("dryRun", False)
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise RequestError("limit must be a whole number")
    if not isinstance(dry_run, bool):
        raise RequestError("dryRun must be true or false")
    if dry_run:
        preview(request)
    return DeadLetters(services_of(request)).redrive(
        name, ids=_ids(body), limit=limit, dry_run=dry_run, actor=identity.subject)


@router.post("/api/admin/dlq/{name}/purge", name="dlq:purge",
             openapi_extra=request_body(DeadLetterPurge, required=False))
def dlq_purge(request: Request, name: str, body: JsonBody = None,
              identity: Identity = require("queues")) -> dict[str, Any]:
    body = body or {}
    known_fields(body, PURGE_FIELDS)
    ids = _ids(body)
    if ids is None and body.get("all") is not True:
        raise RequestError('give "ids", or "all": true to purge every dead letter')
    return DeadLetters(services_of(request)).purge(name, ids=ids, actor=identity.subject)
