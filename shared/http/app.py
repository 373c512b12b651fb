"""The HTTP surface (FastAPI): cron GET, admin POST for every job, admin pages and APIs.

Only the HTTP function imports this module. Feature modules add their own
routers through ``ROUTERS`` ("module:attribute" of an ``APIRouter``).
"""

from __future__ import annotations

import importlib
import uuid
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from shared.core.auth import SESSION_COOKIE, Identity, bearer_token, is_authorized_cron
from shared.core.errors import RequestError, SluiceError, Unauthorized, UpstreamUnavailable
from shared.core.observe import logger
from shared.core.services import Services
from shared.core.surfaces import Surface
from shared.jobs.registry import JOBS, Job
from shared.jobs.runner import run_job
from shared.jobs.runs import RunStore

# Feature routers, imported when the app is built.
ROUTERS: list[str] = ["shared.http.erasure:router", "shared.http.queues:router",
                     "shared.http.delivery:router", "shared.http.delivery:status_router",
                     "shared.http.ops:router", "shared.http.console:router"]

AUDITED_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def request_id(request: Request) -> str:
    rid: str | None = getattr(request.state, "request_id", None)
    return rid or "unknown"


def client_ip(request: Request) -> str | None:
    forwarded = request.headers.get("x-forwarded-for")
    if forwarded:
        return forwarded.split(",")[0].strip()
    return request.client.host if request.client else None


def admin_token(request: Request) -> str | None:
    return bearer_token(request.headers.get("authorization")) or request.cookies.get(SESSION_COOKIE)


def services_of(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def require(surface: Surface) -> Any:
    """A dependency: the admin identity allowed on ``surface`` (401 / 403 otherwise)."""

    def dependency(request: Request) -> Identity:
        verifier = services_of(request).admin
        identity = verifier.verify(admin_token(request))
        request.state.actor = identity.subject  # audited as this actor even when forbidden
        return verifier.authorize_identity(identity, surface)

    return Depends(dependency)


def _job_routes(job: Job) -> APIRouter:
    router = APIRouter()

    def cron(request: Request) -> JSONResponse:
        services = services_of(request)
        if not is_authorized_cron(request.headers.get("authorization"),
                                  services.settings.cron_secret):
            raise Unauthorized("cron bearer missing or wrong")
        outcome = run_job(job, services, "cron_http", request_id=request_id(request),
                          lambda_remaining_ms=_remaining(request))
        return JSONResponse(outcome.body, status_code=outcome.status)

    def admin(request: Request, identity: Identity = require(job.surface)) -> JSONResponse:
        outcome = run_job(job, services_of(request), "admin", request_id=request_id(request),
                          lambda_remaining_ms=_remaining(request),
                          params=dict(request.query_params))
        return JSONResponse(outcome.body, status_code=outcome.status)

    router.add_api_route(job.route, cron, methods=["GET"], name=f"{job.name}:cron")
    router.add_api_route(job.route, admin, methods=["POST"], name=f"{job.name}:admin")
    return router


def _remaining(request: Request) -> Any:
    context = request.scope.get("aws.context")
    return getattr(context, "get_remaining_time_in_millis", None)


def _error_response(request: Request, exc: SluiceError) -> JSONResponse:
    body = exc.to_body()
    body["error"]["requestId"] = request_id(request)
    return JSONResponse(body, status_code=exc.status)


def create_app(services: Services) -> FastAPI:
    app = FastAPI(title="Sluice", version="0.1.0", docs_url="/api/docs", redoc_url=None,
                  openapi_url="/api/openapi.json")
    app.state.services = services

    @app.middleware("http")
    async def context_and_audit(request: Request, call_next: Any) -> Any:
        context = request.scope.get("aws.context")
        request.state.request_id = (getattr(context, "aws_request_id", None)
                                    or request.headers.get("x-request-id") or str(uuid.uuid4()))
        audited = request.method in AUDITED_METHODS and request.url.path.startswith(
            ("/api/admin", "/admin/"))
        try:
            response = await call_next(request)
        except Exception:
            if audited:
                await _audit(request, "500")
            raise
        response.headers["x-request-id"] = request.state.request_id
        if audited:  # every admin action is audited, allowed or not
            await _audit(request, str(response.status_code))
        return response

    async def _audit(request: Request, outcome: str) -> None:
        await run_in_threadpool(
            RunStore(services.db).audit,
            actor=getattr(request.state, "actor", None) or "anonymous",
            action=getattr(request.scope.get("route"), "name", None)
            or f"{request.method} {request.url.path}",
            target=request.url.path,
            outcome=outcome,
            ip=client_ip(request),
            detail={"requestId": request.state.request_id, "query": dict(request.query_params)},
        )

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
        return {"jobs": [
            {"name": job.name, "route": job.route, "schedule": job.schedule,
             "surface": job.surface, "lastRun": _jsonable(last.get(job.name))}
            for job in JOBS.values()
        ]}

    for job in JOBS.values():
        app.include_router(_job_routes(job))
    for target in ROUTERS:
        module, _, attr = target.partition(":")
        app.include_router(getattr(importlib.import_module(module), attr))
    logger.debug("http app built", extra={"routes": len(app.routes)})
    return app


def _jsonable(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}
