"""The HTTP surface (FastAPI): cron GET, admin POST for every job, admin pages and APIs.

Only the HTTP function imports this module. Feature modules add their own
routers through ``ROUTERS`` ("module:attribute" of an ``APIRouter``).
"""

from __future__ import annotations

import importlib
import ipaddress
import math
import re
import uuid
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from fastapi import APIRouter, Body, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from starlette.concurrency import run_in_threadpool

from sluice.core import trace
from sluice.core.auth import (
    SESSION_COOKIE,
    Identity,
    bearer_token,
    check_same_origin,
    is_authorized_cron,
)
from sluice.core.errors import (
    RequestError,
    SluiceError,
    Unauthorized,
    UpstreamUnavailable,
)
from sluice.core.observe import logger
from sluice.core.query import QueryParam
from sluice.core.services import Services
from sluice.core.surfaces import Surface
from sluice.core.times import jsonable
from sluice.core.validate import load_json
from sluice.http.after import install as install_after_response
from sluice.http.guard import InputGuard
from sluice.http.params import openapi_query, strict_query
from sluice.http.served import refuse_taken_routes, served
from sluice.jobs.handoff import hand_off, hands_off
from sluice.jobs.overdue import DisabledMarks, statuses
from sluice.jobs.registry import JOBS, Deadline, Job, get_job
from sluice.jobs.runner import run_job
from sluice.jobs.runs import RunStore
from sluice.jobs.why import job_why
from sluice.store.db import utcnow

# Feature routers, imported when the app is built.
ROUTERS: list[str] = ["sluice.http.erasure:router", "sluice.http.queues:router",
                     "sluice.http.delivery:router", "sluice.http.delivery:status_router",
                     "sluice.http.ops:router", "sluice.http.console:router",
                     "sluice.http.rss:router", "sluice.http.alerts:router",
                     "sluice.http.apidocs:router"]

JSON_BODY = Body(...)
AUDITED_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# A caller's X-Request-Id is used only when it looks like one; otherwise a fresh id.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
AUDIT_STARTED = "started"


# How the API's callers authenticate, as its OpenAPI document declares them (the routes
# read the header themselves; these only describe it).
ADMIN_JWT = HTTPBearer(scheme_name="adminJwt", bearerFormat="JWT", auto_error=False,
                       description="an admin JWT (HS256 with SLUICE_ADMIN_JWT_SECRET, or "
                                   "RS256/ES256 from SLUICE_ADMIN_JWKS_URL) carrying roles")
CRON_BEARER = HTTPBearer(scheme_name="cronBearer", auto_error=False,
                         description="CRON_SECRET, as the scheduler sends it")


def request_id(request: Request) -> str:
    rid: str | None = getattr(request.state, "request_id", None)
    return rid or "unknown"


def client_ip(request: Request) -> str | None:
    """Who connected, as the nearest hop we trust saw it: API Gateway's ``requestContext``
    source IP on Lambda (Mangum passes the event in the scope), the socket's peer locally
    (``sluice dev`` runs uvicorn without its proxy headers), then ``X-Forwarded-For`` only
    as far as ``SLUICE_TRUSTED_PROXIES`` vouch for it (:func:`caller_address`)."""
    peer: str | None = request.client.host if request.client else None
    event = request.scope.get("aws.event")
    if isinstance(event, dict):
        context = event.get("requestContext") or {}
        source = (context.get("http") or {}).get("sourceIp") \
            or (context.get("identity") or {}).get("sourceIp")
        if isinstance(source, str) and source:
            peer = source
    return caller_address(peer, request.headers.get("x-forwarded-for"),
                          services_of(request).settings.trusted_proxies)


def caller_address(peer: str | None, forwarded: str | None,
                   trusted: tuple[str, ...]) -> str | None:
    """The caller's address: ``peer`` (the hop that connected), unless it is a trusted proxy;
    then the right-most ``X-Forwarded-For`` entry that is not one (each proxy appends the
    address it saw, so entries left of an untrusted hop are that hop's claim). Anything that
    is not an IP address ends the walk; no peer or a peer that is not an address is None."""
    networks = _networks(trusted)
    address = _address(peer)
    if address is None:
        return None
    hops = [h.strip() for h in (forwarded or "").split(",")][::-1]
    while hops and any(address in net for net in networks):
        hop = _address(hops.pop(0))
        if hop is None:
            break
        address = hop
    return str(address)


@lru_cache(maxsize=8)
def _networks(trusted: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network,
                                                 ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in trusted)


def _address(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text) if text else None
    except ValueError:
        return None


def is_audited(request: Request) -> bool:
    return request.method in AUDITED_METHODS and request.url.path.startswith(
        ("/api/admin", "/admin/"))


def audit_detail(request: Request) -> dict[str, Any]:
    detail: dict[str, Any] = {"requestId": request_id(request),
                              "query": dict(request.query_params)}
    forwarded = request.headers.get("x-forwarded-for")
    if forwarded:
        detail["forwardedFor"] = forwarded
    detail.update(getattr(request.state, "audit_note", None) or {})
    return detail


def note_audit(request: Request, note: Mapping[str, Any]) -> None:
    """What the action's own audit row adds to the request's detail (what it acted on, how
    many): kept as the action goes, so a failure part way records how far it got."""
    request.state.audit_note = dict(note)


def admin_token(request: Request) -> str | None:
    return bearer_token(request.headers.get("authorization")) or request.cookies.get(SESSION_COOKIE)


def _cookie_authenticated(request: Request) -> bool:
    return bearer_token(request.headers.get("authorization")) is None \
        and bool(request.cookies.get(SESSION_COOKIE))


async def json_object(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object (a route that checks it with the door's table
    reads it raw: the refusals are the door's 400s, not the framework's 422)."""
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError("the body must be UTF-8 JSON", field="body") from None
    body = load_json(text, field="body")
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object", field="body")
    return body


def services_of(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def require(surface: Surface) -> Any:
    """A dependency: the admin identity allowed on ``surface`` (401 / 403 otherwise)."""

    def dependency(request: Request, _: Any = Depends(ADMIN_JWT)) -> Identity:
        services = services_of(request)
        verifier = services.admin
        identity = verifier.verify(admin_token(request))
        request.state.actor = identity.subject  # audited as this actor even when forbidden
        if request.method in AUDITED_METHODS and _cookie_authenticated(request):
            check_same_origin(request.headers.get("origin"), request.headers.get("referer"),
                              request.headers.get("host"))
        verifier.authorize_identity(identity, surface)
        begin_audit(request, identity)
        return identity

    return Depends(dependency)


def begin_audit(request: Request, identity: Identity) -> None:
    """For an authorised admin write: its audit row, written (outcome ``started``) before
    the action runs and settled by the middleware after it. An action whose row cannot
    be written does not run."""
    if is_audited(request) and getattr(request.state, "audit_id", None) is None:
        request.state.audit_id = RunStore(services_of(request).db).audit(
            actor=identity.subject, action=action_name(request), target=request.url.path,
            outcome=AUDIT_STARTED, ip=client_ip(request), detail=audit_detail(request))


def preview(request: Request) -> None:
    """This request only showed what an action would do (a confirmation page, a dry run):
    it changed nothing, so it leaves no audit row; the row begun for it is dropped."""
    request.state.preview = True
    audit_id = getattr(request.state, "audit_id", None)
    if audit_id is not None:
        RunStore(services_of(request).db).discard_audit(audit_id)
        request.state.audit_id = None


# Routes that do what another route does, under that route's action name (by route name).
ACTION_OF: dict[str, Callable[[Request], str]] = {}


def action_name(request: Request) -> str:
    """The audit action: the matched route's name (``area:verb``), or the name of the route
    it does the same as (``ACTION_OF``), else method and path."""
    name = getattr(request.scope.get("route"), "name", None)
    if not isinstance(name, str):
        return f"{request.method} {request.url.path}"
    same_as = ACTION_OF.get(name)
    return same_as(request) if same_as is not None else name


def _query_params(job: Job, *, cron: bool) -> list[QueryParam]:
    return [QueryParam(p.name, p.kind, p.minimum, p.maximum)
            for p in job.params if p.cron or not cron]


def _job_routes(job: Job) -> APIRouter:
    """``GET`` (cron bearer) and ``POST`` (admin) of one job. Each honours exactly the
    parameters the registry declares for it (``strict_query`` refuses any other)."""
    router = APIRouter()

    def cron(request: Request, _: Any = Depends(CRON_BEARER)) -> JSONResponse:
        services = services_of(request)
        if not is_authorized_cron(request.headers.get("authorization"),
                                  services.settings.cron_secret):
            raise Unauthorized("cron bearer missing or wrong")
        outcome = run_job(job, services, "cron_http", request_id=request_id(request),
                          lambda_remaining_ms=_remaining(request),
                          params=dict(request.query_params))
        return JSONResponse(outcome.body, status_code=outcome.status)

    def admin(request: Request, identity: Identity = require(job.surface)) -> JSONResponse:
        """Run the job now, with the caller's parameters. When this function has less time
        than the job's own (the HTTP function on AWS: 30 s), the run is handed to the job's
        function instead: 202, with the run's id and where to follow it (``Location``)."""
        if request.query_params.get("dryRun") == "true":
            preview(request)
        services = services_of(request)
        if hands_off(job, services, _remaining(request)):
            handed = hand_off(job, services, token=admin_token(request),
                              params=dict(request.query_params), source_ip=client_ip(request))
            status = f"/api/admin/console/jobs/{job.name}/runs/{handed.run_id}"
            return JSONResponse({"job": job.name, "runId": handed.run_id, "status": status,
                                 "function": handed.function}, status_code=202,
                                headers={"location": status})
        outcome = run_job(job, services, "admin", request_id=request_id(request),
                          lambda_remaining_ms=_remaining(request),
                          params=dict(request.query_params))
        return JSONResponse(outcome.body, status_code=outcome.status)

    # A handed-off run is audited by the job's function as ``<job>:admin``; this request is
    # the hand-off, as the console's "run now" is.
    ACTION_OF[f"{job.name}:admin"] = lambda request: (
        f"{job.name}:handoff" if hands_off(job, services_of(request), _remaining(request))
        else f"{job.name}:admin")

    def disable(request: Request, body: Any = JSON_BODY,
                identity: Identity = require(job.surface)) -> dict[str, Any]:
        """Mark the job's schedule as disabled on purpose: its state is ``disabled``, not
        ``overdue`` (the schedule itself is switched off where it lives)."""
        if not isinstance(body, dict) or set(body) - {"reason"}:
            raise RequestError("the body is {\"reason\": text}", field="body")
        mark = DisabledMarks(services_of(request).db).mark_disabled(
            job.name, reason=body.get("reason"), actor=identity.subject, now=utcnow())
        return {"job": job.name, "disabled": mark}

    def enable(request: Request, identity: Identity = require(job.surface)) -> dict[str, Any]:
        return {"job": job.name, "disabled": None,
                "wasDisabled": DisabledMarks(services_of(request).db).mark_enabled(job.name)}

    marked = f"/api/admin/jobs/{job.name}/disabled"
    router.add_api_route(marked, disable, methods=["PUT"], name=f"{job.name}:disable")
    router.add_api_route(marked, enable, methods=["DELETE"], name=f"{job.name}:enable")
    router.add_api_route(job.route, cron, methods=["GET"], name=f"{job.name}:cron",
                         openapi_extra=openapi_query(_query_params(job, cron=True)))
    router.add_api_route(job.route, admin, methods=["POST"], name=f"{job.name}:admin",
                         openapi_extra=openapi_query(_query_params(job, cron=False)))
    return router


def _remaining(request: Request) -> Any:
    context = request.scope.get("aws.context")
    return getattr(context, "get_remaining_time_in_millis", None)


def request_deadline(request: Request) -> Deadline | None:
    """When an action that runs inside this request stops: the Lambda's remaining time less
    the deadline margin; None outside Lambda (``sluice dev``, a test client)."""
    remaining = _remaining(request)
    if remaining is None:
        return None
    return Deadline.for_run(math.inf, remaining(),
                            services_of(request).settings.deadline_margin_s)


def _error_response(request: Request, exc: SluiceError) -> JSONResponse:
    body = exc.to_body()
    body["error"]["requestId"] = request_id(request)
    return JSONResponse(body, status_code=exc.status)


def create_app(services: Services, *, push: bool = False) -> FastAPI:
    """The app; ``push``: with the local push endpoint (``sluice dev`` only, see
    ``sluice.http.push``)."""
    app = FastAPI(title="Sluice", version="0.1.0", docs_url=None, redoc_url=None,
                  openapi_url="/api/openapi.json", dependencies=[Depends(strict_query)])
    app.state.services = services
    # Innermost of the middleware: undecodable input is refused before any route
    # runs, and that refusal is still audited by ``context_and_audit`` around it.
    app.add_middleware(InputGuard)

    @app.middleware("http")
    async def context_and_audit(request: Request, call_next: Any) -> Any:
        context = request.scope.get("aws.context")
        given = request.headers.get("x-request-id")
        request.state.request_id = (getattr(context, "aws_request_id", None)
                                    or (given if given and _REQUEST_ID.match(given) else None)
                                    or str(uuid.uuid4()))
        audited = is_audited(request)
        if not audited:
            response = await call_next(request)
            response.headers["x-request-id"] = request.state.request_id
            return response
        # An operator's action is a span: what it does (a redrive, a replay's enqueues)
        # happens inside it.
        with trace.span("operator action", kind="server", attributes={
                "http.request.method": request.method, "url.path": request.url.path,
                "faas.invocation_id": request.state.request_id}) as span:
            try:
                response = await call_next(request)
            except Exception:
                await _audit(request, "500")
                raise
            finally:
                action = action_name(request)
                span.rename(f"operator {action}")
                span.set("sluice.action", action)
                span.set("sluice.actor", getattr(request.state, "actor", None))
                span.set("sluice.destination", request.path_params.get("key"))
                span.set("sluice.entry_id", request.path_params.get("entry_id"))
            span.set("http.response.status_code", response.status_code)
            span.set("sluice.outcome", str(response.status_code))
            response.headers["x-request-id"] = request.state.request_id
            # Every admin action is audited, allowed or not; a preview is not an action.
            if getattr(request.state, "preview", False):
                span.set("sluice.preview", True)
            else:
                await _audit(request, str(response.status_code))
            return response

    async def _audit(request: Request, outcome: str) -> None:
        """Settle the row written before the action, or record a refused request."""
        runs = RunStore(services.db)
        audit_id = getattr(request.state, "audit_id", None)
        try:
            if audit_id is not None:
                await run_in_threadpool(runs.complete_audit, audit_id, outcome,
                                        audit_detail(request))
            else:
                known = getattr(request.state, "actor", None)
                actor = known if isinstance(known, str) and known else \
                    await run_in_threadpool(_presented_subject, request)
                await run_in_threadpool(
                    runs.audit, actor=actor,
                    action=action_name(request), target=request.url.path, outcome=outcome,
                    ip=client_ip(request), detail=audit_detail(request))
        except SluiceError as exc:
            # The action (if any) ran after its row was written; the response stands.
            services.reporter.error("http.audit", exc, path=request.url.path,
                                    auditId=audit_id, outcome=outcome)

    def _presented_subject(request: Request) -> str:
        """Who a request refused before authentication claims to be, when its token
        verifies (a refused query string, say); else ``anonymous``."""
        try:
            return services.admin.verify(admin_token(request)).subject
        except SluiceError:
            return "anonymous"

    @app.exception_handler(SluiceError)
    async def sluice_error(request: Request, exc: SluiceError) -> JSONResponse:
        if not isinstance(exc, RequestError | UpstreamUnavailable):
            services.reporter.error("http", exc, path=request.url.path)
            body = {"error": {"code": "internal_error", "message": exc.message,
                              "cause": exc.code, "requestId": request_id(request)}}
            return JSONResponse(body, status_code=exc.status)
        return _error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [{"loc": list(e.get("loc", ())), "message": e.get("msg")} for e in exc.errors()]
        return JSONResponse({"error": {"code": "bad_request", "message": "invalid request",
                                       "details": details, "requestId": request_id(request)}},
                            status_code=422)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        services.reporter.error("http", exc, path=request.url.path)
        return JSONResponse({"error": {"code": "internal_error",
                                       "requestId": request_id(request)}}, status_code=500)

    @app.get("/api/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "jobs": sorted(JOBS)}

    @app.get("/api/admin/jobs")
    def jobs(request: Request, identity: Identity = require("queues")) -> dict[str, Any]:
        last = RunStore(services.db).last_runs()
        states = statuses(services.db, utcnow())
        return {"jobs": [
            {"name": job.name, "route": job.route, "schedule": job.schedule,
             "surface": job.surface, "lastRun": jsonable(last.get(job.name)),
             **states[job.name]}
            for job in JOBS.values()
        ]}

    @app.get("/api/admin/jobs/{name}/why")
    def job_why_route(request: Request, name: str,
                      identity: Identity = require("queues")) -> dict[str, Any]:
        """Why the job is overdue or not running, in one sentence (``kind``, ``until``,
        ``sentence``), with the state, lease, last run and alarm it is judged from."""
        return job_why(services.db, get_job(name), utcnow())

    own = []
    for target in ROUTERS:
        module, _, attr = target.partition(":")
        own.append(served(getattr(importlib.import_module(module), attr)))
    if push:
        from sluice.http.push import push_router

        own.append(push_router(services))
    # Sluice's own routes, which no job may take: the app's above, the routers' below
    refuse_taken_routes(JOBS.values(), [*app.router.routes,
                                        *(route for router in own for route in router.routes)])
    for job in JOBS.values():
        app.include_router(_job_routes(job))
    for router in own:
        app.include_router(router)
    install_after_response(app)
    from sluice.http.apidocs import describe

    app.openapi = lambda: describe(app)  # type: ignore[method-assign]
    logger.debug("http app built", extra={"routes": len(app.routes)})
    return app
