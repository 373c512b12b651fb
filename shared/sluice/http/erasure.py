"""Admin API for GDPR erasure requests (surface ``erasure``: roles super_admin, privacy).

Every POST here is audited by the app's middleware. The purge job's own route,
``/api/admin/erasure/purge``, comes from the job registry like every job's.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from sluice.core.auth import Identity
from sluice.erasure.purge import confirm, count_subject
from sluice.erasure.registry import EXEMPTIONS, EXTERNAL_STORES, TARGETS
from sluice.erasure.requests import ErasureStore, check_status, check_subject
from sluice.http.app import json_object, preview, require, services_of
from sluice.http.models import ErasureBody, ErasureRequestBody, request_body
from sluice.ops.door import admit

router = APIRouter(prefix="/api/admin/erasure", tags=["erasure"])


@router.post("/requests", name="erasure:create", status_code=201,
             response_model=ErasureBody,
             responses={200: {"model": ErasureBody,
                              "description": "the subject's open request, opened before"},
                        201: {"description": "opened"}},
             openapi_extra=request_body(ErasureRequestBody))
async def create_request(request: Request,
                         identity: Identity = require("erasure")) -> JSONResponse:
    """Open an erasure request (the door's table, as ``sluice.request_erasure`` and
    ``sluice erasure request`` check it); requested by the caller's identity."""
    services = services_of(request)
    checked = admit("request_erasure", await json_object(request), services.settings,
                    body=True, caller={"requestedBy": identity.subject})
    created, is_new = await run_in_threadpool(
        ErasureStore(services.db).create, checked["subjectUserId"],
        requested_by=checked["requestedBy"], grace_days=checked["graceDays"],
        tenant_id=checked["tenantId"])
    return JSONResponse(created.to_json(), status_code=201 if is_new else 200)


@router.get("/requests", name="erasure:list")
def list_requests(request: Request, status: str | None = None,
                  subjectUserId: str | None = None,
                  limit: int = 100, identity: Identity = require("erasure")) -> dict[str, Any]:
    subject = check_subject(subjectUserId) if subjectUserId is not None else None
    rows = ErasureStore(services_of(request).db).list(status=check_status(status),
                                                      subject=subject, limit=limit)
    return {"requests": [row.to_json() for row in rows]}


@router.get("/summary", name="erasure:summary")
def summary(request: Request, identity: Identity = require("erasure")) -> dict[str, Any]:
    """Due requests and counts by status (for the operations surface)."""
    return ErasureStore(services_of(request).db).summary()


@router.get("/requests/{request_id}", name="erasure:show")
def show_request(request: Request, request_id: str,
                 identity: Identity = require("erasure")) -> dict[str, Any]:
    return ErasureStore(services_of(request).db).get(request_id).to_json()


@router.post("/requests/{request_id}/cancel", name="erasure:cancel")
def cancel_request(request: Request, request_id: str,
                   identity: Identity = require("erasure")) -> dict[str, Any]:
    return ErasureStore(services_of(request).db).cancel(request_id).to_json()


@router.post("/requests/{request_id}/confirm", name="erasure:confirm")
def confirm_request(request: Request, request_id: str, dryRun: bool = False,
                    identity: Identity = require("erasure")) -> dict[str, Any]:
    """Purge now, skipping the rest of the grace window; ``?dryRun=true`` only counts."""
    dry_run = dryRun
    if dry_run:
        preview(request)
    current, outcome = confirm(services_of(request), request_id, confirmed_by=identity.subject,
                               dry_run=dry_run)
    body = current.to_json()
    if dry_run:
        body["dryRun"] = True
        body["wouldPurge"] = outcome.tables
    return body


@router.get("/subjects/{subject}", name="erasure:verify")
def verify_subject(request: Request, subject: str,
                   identity: Identity = require("erasure")) -> dict[str, Any]:
    """What every registered store still holds of ``subject`` (the verification, on demand)."""
    counts = count_subject(services_of(request), check_subject(subject, "subject"))
    return {"subjectUserId": subject, "remaining": counts, "clean": not any(counts.values())}


@router.get("/registry", name="erasure:registry")
def registry(identity: Identity = require("erasure")) -> dict[str, Any]:
    return {
        "targets": [{"name": t.name, "table": t.table, "columns": [c for c in t.columns if c],
                     "how": t.how.value, "note": t.note} for t in TARGETS],
        "exemptions": [{"table": e.table, "column": e.column or None, "reason": e.reason}
                       for e in EXEMPTIONS],
        "externalStores": [store.name for store in EXTERNAL_STORES],
    }
