"""Admin API for the delivery queue (surface ``delivery``: roles super_admin, ops).

Read failed and pending entries, redrive failed ones (back to ``pending``, attempts
reset) and purge them ("never send this": failed or unknown entries); for an entry
resting ``unknown`` (sent, no answer), mark it delivered or send it again; replay a
destination's window (``sluice.delivery.replay``); say what holds one entry and until when
(``GET …/entries/{id}/why``, ``sluice.delivery.why``). The destinations:
``GET /api/admin/delivery/destinations`` (each with its state, entries waiting, last error
and success, the rates in force), one of them, and a change of one
(``POST …/destinations/{key}/pause|resume|disable|enable|rate``, ``"dryRun": true`` for the
preview, which writes no audit row). Every POST is audited by the app's middleware (a
destination change with what it changed, and until when, in ``detail.change``). The drain's
own route, ``/api/admin/delivery/drain``, comes from the job registry.
``GET /api/queue/status`` (the cron bearer, or an admin on ``delivery``) is the
queue's health: depth per status (``unknown`` included), entries in backoff, the
oldest pending entry's age, every failing destination with the entries waiting on it
(``destinations``; ``down`` once reported), and the last drain's summary.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from sluice.core.auth import Identity, is_authorized_cron
from sluice.core.errors import RequestError
from sluice.core.times import iso_z
from sluice.delivery.channels import Outbound, channels
from sluice.delivery.destinations import Destinations, check_key
from sluice.delivery.replay import AuditRow, Replay, ReplayReport, parse_filter
from sluice.delivery.store import DeliveryStore, check_status
from sluice.delivery.why import why
from sluice.http.app import (
    ADMIN_JWT,
    CRON_BEARER,
    admin_token,
    audit_detail,
    json_object,
    note_audit,
    preview,
    request_deadline,
    require,
    services_of,
)
from sluice.http.models import DeliveryEntryBody, DeliveryReplay, DeliveryRequest, request_body
from sluice.jobs.runs import RunStore
from sluice.ops import destinations as control
from sluice.ops.door import admit

router = APIRouter(prefix="/api/admin/delivery", tags=["delivery"])
status_router = APIRouter(tags=["delivery"])
DRAIN_JOB = "delivery-drain"


def _store(request: Request) -> DeliveryStore:
    return DeliveryStore(services_of(request).db)


@router.get("/stats", name="delivery:stats")
def stats(request: Request, identity: Identity = require("delivery")) -> dict[str, Any]:
    """Count and oldest enqueue time per status."""
    return {"statuses": _store(request).stats()}


@router.get("/entries", name="delivery:list")
def list_entries(request: Request, status: str | None = None, channel: str | None = None,
                 destination: str | None = None, limit: int = 100,
                 identity: Identity = require("delivery")) -> dict[str, Any]:
    """Newest first; ``destination``: the entries a drain has taken for that key (each
    entry's ``destination``)."""
    rows = _store(request).list(status=check_status(status), channel=channel or None,
                                destination=check_key(destination) if destination else None,
                                limit=limit)
    return {"entries": [row.to_json() for row in rows]}


@router.post("/entries", name="delivery:enqueue", status_code=201,
             response_model=DeliveryEntryBody,
             responses={200: {"model": DeliveryEntryBody,
                              "description": "the entry stored before with this idempotencyKey"},
                        201: {"description": "stored, pending, due now"}},
             openapi_extra=request_body(DeliveryRequest))
async def enqueue_entry(request: Request,
                        identity: Identity = require("delivery")) -> JSONResponse:
    """Store a message for delivery-drain to send, checked by the door's table exactly as
    ``sluice.enqueue_delivery`` and ``sluice delivery enqueue`` check it."""
    services = services_of(request)
    body = await json_object(request)
    checked = admit("enqueue_delivery", body, services.settings, body=True)
    entry, created = await run_in_threadpool(
        DeliveryStore(services.db).enqueue, checked["channel"], checked["recipient"],
        checked["payload"], idempotency_key=checked["idempotencyKey"],
        subject_user_id=checked["subjectUserId"])
    return JSONResponse(entry.to_json(), status_code=201 if created else 200)


@router.get("/entries/{entry_id}", name="delivery:show")
def show_entry(request: Request, entry_id: str,
               identity: Identity = require("delivery")) -> dict[str, Any]:
    return _store(request).get(entry_id).to_json()


@router.get("/entries/{entry_id}/why", name="delivery:why")
def why_entry(request: Request, entry_id: str,
              identity: Identity = require("delivery")) -> dict[str, Any]:
    """What holds the entry, and until when: ``kind`` (docs/delivery.md, "Why is this
    waiting?"), ``until``, ``sentence``, the ``key`` that holds it and its ``expiresAt``."""
    return why(services_of(request), entry_id).to_json()


@router.post("/entries/{entry_id}/redrive", name="delivery:redrive")
def redrive_entry(request: Request, entry_id: str,
                  identity: Identity = require("delivery")) -> dict[str, Any]:
    """A failed entry back to pending, due now, attempts reset (409 unless failed)."""
    return _store(request).redrive(entry_id).to_json()


@router.post("/entries/{entry_id}/purge", name="delivery:purge")
def purge_entry(request: Request, entry_id: str,
                identity: Identity = require("delivery")) -> dict[str, Any]:
    """Delete one failed or unknown entry (409 for any other status)."""
    _store(request).purge(entry_id)
    return {"purged": 1, "id": entry_id}


@router.post("/entries/{entry_id}/mark-delivered", name="delivery:mark_delivered")
def mark_delivered(request: Request, entry_id: str,
                   identity: Identity = require("delivery")) -> dict[str, Any]:
    """An unknown entry the receiver confirmed: acked (409 unless unknown)."""
    return _store(request).mark_delivered(entry_id).to_json()


@router.post("/entries/{entry_id}/send-again", name="delivery:send_again")
def send_again(request: Request, entry_id: str,
               identity: Identity = require("delivery")) -> dict[str, Any]:
    """An unknown entry back to pending, due now, attempts reset (409 unless unknown)."""
    return _store(request).send_again(entry_id).to_json()


@router.post("/redrive", name="delivery:redrive_all")
def redrive_all(request: Request, channel: str | None = None, destination: str | None = None,
                identity: Identity = require("delivery")) -> dict[str, Any]:
    """Every failed entry (of ``channel``, of ``destination``, if given) back to pending."""
    return {"redriven": _store(request).redrive_all(
        channel=channel or None, destination=check_key(destination) if destination else None)}


@router.get("/destinations", name="delivery:destinations")
def destinations(request: Request, state: str | None = None, limit: str | None = None,
                 after: str | None = None,
                 identity: Identity = require("delivery")) -> dict[str, Any]:
    """The destinations by key, a page at a time (``limit``: 1 to 1,000, 100 by default;
    ``after``: the ``next`` of the page before; ``state``: only ``ok``, ``failing``,
    ``paused`` or ``disabled`` ones): see docs/delivery.md, "The destinations view"."""
    return control.view(services_of(request), control.parse_page(
        {"state": state or None, "limit": limit or None, "after": after or None}))


@router.get("/destinations/{key}", name="delivery:destination")
def destination(request: Request, key: str,
                identity: Identity = require("delivery")) -> dict[str, Any]:
    return control.describe(services_of(request), check_key(key))


def _change_route(action: str) -> Any:
    async def change(request: Request, key: str,
                     identity: Identity = require("delivery")) -> dict[str, Any]:
        raw = await request.body()
        body = await json_object(request) if raw.strip() else {}
        dry_run = body.pop("dryRun", False)
        if not isinstance(dry_run, bool):
            raise RequestError("dryRun must be true or false", field="dryRun")
        parsed = control.parse_change(action, key, body)
        services = services_of(request)
        if dry_run:
            preview(request)
            return await run_in_threadpool(control.preview, services, parsed)
        note_audit(request, {"change": parsed.to_json()})
        return await run_in_threadpool(control.apply, services, parsed)

    change.__doc__ = (f"{control.ACTIONS[action].help.capitalize()}. Body: "
                      f"{', '.join(control.ACTIONS[action].fields) or 'none'}, and "
                      "dryRun (the preview: what it would do, nothing changed, no audit row).")
    return change


for _action in control.ACTIONS:
    router.add_api_route(f"/destinations/{{key}}/{_action}", _change_route(_action),
                         methods=["POST"], name=f"delivery:destination_{_action}")


@router.post("/purge", name="delivery:purge_all")
def purge_all(request: Request, channel: str | None = None,
              identity: Identity = require("delivery")) -> dict[str, Any]:
    """Delete every failed entry (of ``channel``, if given)."""
    return {"purged": _store(request).purge_all(channel=channel or None)}


@router.post("/replay", name="delivery:replay", openapi_extra=request_body(DeliveryReplay))
async def replay(request: Request, identity: Identity = require("delivery")) -> dict[str, Any]:
    """A destination's window sent again: its entries of one status, enqueued from ``since``
    until ``until``, made due for the drain, afresh (no cap). ``dryRun`` counts what would
    go and what the receiver already acknowledged, and changes nothing. The audit row holds
    the filter and the count, written with each page. On Lambda it stops before the
    function's deadline: ``next`` is then the body to send again for the rest."""
    services = services_of(request)
    body = await json_object(request)
    dry_run = body.pop("dryRun", False)
    if not isinstance(dry_run, bool):
        raise RequestError("dryRun must be true or false", field="dryRun")
    flt = parse_filter(body, channels=list(channels()))
    if dry_run:
        preview(request)
    audit_id = getattr(request.state, "audit_id", None)
    audit = None if dry_run or audit_id is None else AuditRow(
        RunStore(services.db), audit_id, audit_detail(request))
    deadline = request_deadline(request)

    def run() -> ReplayReport:
        with Outbound.open(services.settings) as client:
            return Replay.from_services(services, client).run(
                flt, dry_run=dry_run, deadline=deadline, audit=audit,
                progress=lambda report: note_audit(request, report.to_json()))

    return (await run_in_threadpool(run)).to_json()


@status_router.get("/api/queue/status", name="delivery:queue_status")
def queue_status(request: Request, _cron: Any = Depends(CRON_BEARER),
                 _admin: Any = Depends(ADMIN_JWT)) -> dict[str, Any]:
    """Queue health for monitoring: the cron bearer or an admin allowed on ``delivery``."""
    services = services_of(request)
    if not is_authorized_cron(request.headers.get("authorization"),
                              services.settings.cron_secret):
        identity = services.admin.verify(admin_token(request))
        services.admin.authorize_identity(identity, "delivery")
    if request.query_params:
        raise RequestError(f"unknown query parameter {min(request.query_params)!r}")
    status = DeliveryStore(services.db).queue_status()
    status["destinations"] = Destinations(
        services.db, services.settings.delivery_outage_threshold).status()
    last = next((run for run in RunStore(services.db).recent(DRAIN_JOB, 10)
                 if run["outcome"] in ("ok", "failures")), None)
    status["lastSummary"] = None if last is None else {
        "finishedAt": _iso(last["finished_at"]), "outcome": last["outcome"],
        "summary": last["result"]}
    return status


def _iso(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return iso_z(value)
