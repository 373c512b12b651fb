"""The operations console: server-rendered pages under ``/admin`` and their JSON twins.

Every page's figures come from one model function; the page renders it and the twin under
``/api/admin/console/…`` returns it as JSON, so both show the same numbers. Every action is a
form POST carrying the session's CSRF token; the app's middleware audits it like any admin write.
Destructive actions go through a confirmation page (redrive: a dry-run preview first).
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from sluice.core.auth import SESSION_COOKIE, Identity
from sluice.core.errors import NotFound, RequestError, SluiceError
from sluice.core.extensions import packs_on
from sluice.core.packs import owner
from sluice.core.services import Services
from sluice.core.surfaces import Surface
from sluice.core.times import iso_z, json_default
from sluice.http.app import (
    ACTION_OF,
    admin_token,
    client_ip,
    preview,
    request_id,
    services_of,
)
from sluice.http.console.guard import (
    CSRF_FIELD,
    Denied,
    check,
    check_csrf,
    csrf_token,
    is_https,
    landing,
)
from sluice.http.console.render import render
from sluice.http.params import check_names, checked_by_handler
from sluice.jobs.runs import RunStore
from sluice.ops import console as model
from sluice.ops.access import DEFAULT_TTL, DEV_SUBJECT, redeem_login_nonce
from sluice.store.db import utcnow

router = APIRouter(include_in_schema=True, tags=["console"])

STATIC = Path(__file__).parent / "static"
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".svg": "image/svg+xml"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff",
                    "referrer-policy": "no-referrer", "x-frame-options": "DENY",
                    "cache-control": "no-store"}
NAV: tuple[tuple[str, str], ...] = (
    ("/admin/queues", "Overview"), ("/admin/history", "History"),
    ("/admin/dlq", "Dead letters"), ("/admin/jobs", "Jobs"),
    ("/admin/deliveries", "Deliveries"), ("/admin/erasure", "Erasure"),
    ("/admin/flags", "Flags"), ("/admin/audit", "Audit"),
)
PAGE_SIZES = (10, 25, 50, 100)


def nav() -> tuple[tuple[str, str], ...]:
    """The pages of ``NAV`` this deployment serves (a pack that is off takes its own)."""
    return tuple((path, label) for path, label in NAV
                 if (pack := owner(path)) is None or pack in packs_on())


# --- plumbing ------------------------------------------------------------------------------


def _secure(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response


def _page(request: Request, template: str, *, status: int = 200,
          identity: Identity | None = None, **context: Any) -> Response:
    html = render(template, request=request, now=utcnow(), nav=nav(), path=request.url.path,
                  identity=identity, csrf=csrf_token(request) if identity else "",
                  csrf_field=CSRF_FIELD, **context)
    return _secure(HTMLResponse(html, status_code=status))


def _denied(request: Request, denied: Denied) -> Response:
    return _page(request, "restricted.html", status=denied.status, denied=denied)


def _params(request: Request, allowed: Iterable[str]) -> dict[str, str]:
    """The query parameters, every one of them honoured (an unknown one is a 400)."""
    check_names(request.query_params.multi_items(), allowed)
    return {k: v for k, v in request.query_params.items()}


def _int(params: dict[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or not lo <= int(raw) <= hi:
        raise RequestError(f"{name} must be a whole number from {lo} to {hi}")
    return int(raw)


class Form:
    """A posted form whose every field is honoured (an unknown one is a 400)."""

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        self.fields = fields

    def get(self, name: str, default: str = "") -> str:
        for key, value in self.fields:
            if key == name:
                return value
        return default

    def getlist(self, name: str) -> list[str]:
        return [v for k, v in self.fields if k == name and v]

    def flag(self, name: str) -> bool:
        return self.get(name) in ("1", "true", "on")


async def _form(request: Request, allowed: Iterable[str]) -> Form:
    # An action takes its input from the form only: a query string it would ignore
    # (``?dryRun=true`` on a purge) is refused, as the API refuses it.
    check_names(request.query_params.multi_items(), ())
    data = await request.form()
    fields = [(k, v) for k, v in data.multi_items() if isinstance(v, str)]
    known = {CSRF_FIELD, *allowed}
    unknown = sorted({k for k, _ in fields} - known)
    if unknown:
        raise RequestError(f"unknown form field(s): {', '.join(unknown)}")
    form = Form(fields)
    check_csrf(request, form.get(CSRF_FIELD))
    return form


def _signature(handler: Callable[..., Any]) -> inspect.Signature:
    """The handler's own parameters (path and query) behind ``request``, for FastAPI."""
    params = [p for name, p in inspect.signature(handler).parameters.items()
              if name not in ("request", "identity")]
    return inspect.Signature([inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                annotation=Request), *params])


def _guarded(surface: Surface | Callable[[Request], Surface]) -> Callable[..., Any]:
    """Wrap a page handler: identity check (restricted page), then typed errors as a page."""

    def wrap(handler: Callable[..., Any]) -> Callable[..., Any]:
        async def page(request: Request, **kwargs: Any) -> Response:
            need = surface(request) if callable(surface) else surface
            identity = check(request, need)
            if isinstance(identity, Denied):
                return _denied(request, identity)
            try:
                response: Response = await handler(request, identity, **kwargs)
            except SluiceError as exc:
                if not isinstance(exc, RequestError):
                    _services(request).reporter.error("console", exc, path=request.url.path)
                return _page(request, "message.html", status=exc.status, identity=identity,
                             title="That did not work", error=exc.to_body()["error"],
                             request_id=request_id(request))
            return response

        page.__name__ = handler.__name__
        page.__doc__ = handler.__doc__
        page.__signature__ = _signature(handler)  # type: ignore[attr-defined]
        page.surface = surface  # type: ignore[attr-defined]  # read by nav_surfaces
        return page

    return wrap


def _twin(surface: Surface) -> Callable[..., Any]:
    """A JSON twin: the same model, with the API's 401/403."""

    def wrap(handler: Callable[..., Any]) -> Callable[..., Any]:
        async def twin(request: Request, **kwargs: Any) -> Response:
            identity = check(request, surface)
            if isinstance(identity, Denied):
                code = "forbidden" if identity.status == 403 else "unauthorized"
                return JSONResponse({"error": {"code": code, "reason": identity.reason,
                                               "message": identity.detail,
                                               "requestId": request_id(request)}},
                                    status_code=identity.status)
            body = await handler(request, identity, **kwargs)
            return JSONResponse(json.loads(json.dumps(body, default=json_default)))

        twin.__name__ = handler.__name__ + "_json"
        twin.__doc__ = handler.__doc__
        twin.__signature__ = _signature(handler)  # type: ignore[attr-defined]
        return twin

    return wrap


def _services(request: Request) -> Services:
    return services_of(request)


# --- getting in ----------------------------------------------------------------------------


@router.get("/admin/static/{name}", include_in_schema=False)
def static(name: str) -> Response:
    files = {p.name: p for p in STATIC.iterdir() if p.suffix in STATIC_TYPES}
    if name not in files:
        raise NotFound(f"no console asset {name!r}")
    path = files[name]
    response = Response(path.read_bytes(), media_type=STATIC_TYPES[path.suffix])
    response.headers["cache-control"] = "public, max-age=300"
    response.headers["x-content-type-options"] = "nosniff"
    return response


def nav_surfaces() -> list[tuple[str, Surface]]:
    """Each page of ``NAV`` with the surface its own guard checks (read from its route)."""
    guards: dict[str, Surface] = {
        route.path: cast(Surface, surface) for route in router.routes if isinstance(route, APIRoute)
        and isinstance(surface := getattr(route.endpoint, "surface", None), str)}
    return [(path, guards[path]) for path, _ in nav() if path in guards]


@router.get("/admin", include_in_schema=False)
def home(request: Request) -> Response:
    """The session's landing page: the first page of the navigation its roles open (ops and
    super_admin the queues' overview, privacy erasure, ...)."""
    return RedirectResponse(landing(request, nav_surfaces()), status_code=303)


@router.get("/admin/login", name="console:login", include_in_schema=False)
async def login(request: Request, nonce: str = "") -> Response:
    """Redeem a one-time login link: set the session cookie and go to the console."""
    services = _services(request)
    try:
        token = await run_in_threadpool(redeem_login_nonce, services.settings, services.state,
                                        nonce)
    except SluiceError as exc:
        await run_in_threadpool(RunStore(services.db).audit, actor="anonymous",
                                action="console:login", target="/admin/login", outcome="401",
                                ip=client_ip(request), detail={"requestId": request_id(request),
                                                               "error": exc.message})
        denied = Denied(401, "link", exc.message, "This login link does not work",
                        "A login link works once and for a few minutes.")
        return _denied(request, denied)
    await run_in_threadpool(RunStore(services.db).audit, actor=DEV_SUBJECT,
                            action="console:login", target="/admin/login", outcome="ok",
                            ip=client_ip(request), detail={"requestId": request_id(request)})
    response = RedirectResponse("/admin", status_code=303)  # its landing page, from there
    response.set_cookie(SESSION_COOKIE, token, max_age=int(DEFAULT_TTL.total_seconds()),
                        httponly=True, samesite="strict", secure=is_https(request), path="/")
    return _secure(response)


@router.post("/admin/logout", name="console:logout", include_in_schema=False)
async def logout(request: Request) -> Response:
    await _form(request, ())
    response = RedirectResponse("/admin/queues", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict",
                           secure=is_https(request))
    return _secure(response)


# --- overview and history ------------------------------------------------------------------


def overview_model(services: Services) -> dict[str, Any]:
    # Reading writes nothing: the history-sample job samples on its schedule.
    return model.overview(services)


@router.get("/admin/queues", name="console:overview", include_in_schema=False)
@_guarded("queues")
async def overview_page(request: Request, identity: Identity) -> Response:
    _params(request, ())
    services = _services(request)
    data = await run_in_threadpool(overview_model, services)
    history = await run_in_threadpool(model.history, services)
    # depth over time is sampled by the history pack's job: without it there is none to draw
    return _page(request, "overview.html", identity=identity, title="Queue health",
                 data=data, history=history, depths="history" in packs_on(), refresh=True)


@router.get("/api/admin/console/overview", name="console:overview.json")
@_twin("queues")
async def overview_json(request: Request, identity: Identity) -> dict[str, Any]:
    _params(request, ())
    return await run_in_threadpool(overview_model, _services(request))


@router.get("/admin/history", name="console:history", include_in_schema=False)
@_guarded("queues")
async def history_page(request: Request, identity: Identity) -> Response:
    _params(request, ())
    history = await run_in_threadpool(model.history, _services(request))
    return _page(request, "history.html", identity=identity, title="History", history=history,
                 refresh=True)


@router.get("/api/admin/console/history", name="console:history.json")
@_twin("queues")
async def history_json(request: Request, identity: Identity) -> dict[str, Any]:
    _params(request, ())
    return await run_in_threadpool(model.history, _services(request))


# --- dead letters --------------------------------------------------------------------------


def _dead_letters(services: Services) -> Any:
    from sluice.ops.deadletters import DeadLetters

    return DeadLetters(services)


def dlq_index_model(services: Services) -> dict[str, Any]:
    return {"generatedAt": iso_z(utcnow()), "queues": _dead_letters(services).overview()}


def dlq_page_model(services: Services, name: str, page: int, size: int) -> dict[str, Any]:
    from sluice.ops.deadletters import MAX_LIST

    first = (page - 1) * size
    if first >= MAX_LIST:
        raise RequestError(f"only the newest {MAX_LIST} dead letters can be listed")
    listed = _dead_letters(services).list_letters(name, min(MAX_LIST, first + size))
    depth = listed["depth"]
    return {"queue": name, "depth": depth, "page": page, "size": size,
            "pages": max(1, math.ceil(min(depth, MAX_LIST) / size)),
            "items": listed["items"][first:first + size], "generatedAt": iso_z(utcnow())}


@router.get("/admin/dlq", name="console:dlq", include_in_schema=False)
@_guarded("queues")
async def dlq_index(request: Request, identity: Identity) -> Response:
    _params(request, ())
    data = await run_in_threadpool(dlq_index_model, _services(request))
    return _page(request, "dlq_index.html", identity=identity, title="Dead letters", data=data,
                 refresh=True)


@router.get("/api/admin/console/dlq", name="console:dlq.json")
@_twin("queues")
async def dlq_index_json(request: Request, identity: Identity) -> dict[str, Any]:
    _params(request, ())
    return await run_in_threadpool(dlq_index_model, _services(request))


def _paging(request: Request) -> tuple[int, int]:
    params = _params(request, ("page", "size"))
    return _int(params, "page", 1, 1, 10_000), _int(params, "size", 25, 1, max(PAGE_SIZES))


@router.get("/admin/dlq/{name}", name="console:dlq.list", include_in_schema=False)
@_guarded("queues")
async def dlq_list(request: Request, identity: Identity, name: str) -> Response:
    page, size = _paging(request)
    data = await run_in_threadpool(dlq_page_model, _services(request), name, page, size)
    return _page(request, "dlq_list.html", identity=identity, title=f"Dead letters · {name}",
                 data=data, sizes=PAGE_SIZES, refresh=True)


@router.get("/api/admin/console/dlq/{name}", name="console:dlq.list.json")
@_twin("queues")
async def dlq_list_json(request: Request, identity: Identity, name: str) -> dict[str, Any]:
    page, size = _paging(request)
    return await run_in_threadpool(dlq_page_model, _services(request), name, page, size)


@router.get("/admin/dlq/{name}/{entry_id}", name="console:dlq.show", include_in_schema=False)
@_guarded("queues")
async def dlq_show(request: Request, identity: Identity, name: str, entry_id: str) -> Response:
    _params(request, ())
    letter = await run_in_threadpool(_dead_letters(_services(request)).show, name, entry_id)
    return _page(request, "dlq_show.html", identity=identity, title=f"Dead letter {entry_id}",
                 queue=name, letter=letter,
                 body=json.dumps(letter.get("body"), indent=2, sort_keys=True, default=json_default))


def _chosen(form: Form) -> tuple[str, list[str] | None]:
    scope = form.get("scope", "selected")
    if scope not in ("one", "selected", "all"):
        raise RequestError("scope must be one, selected or all")
    ids = form.getlist("ids")
    if scope == "all":
        return scope, None
    if not ids:
        raise RequestError("select at least one dead letter")
    return scope, ids


@router.post("/admin/dlq/{name}/redrive", name="dlq:redrive", include_in_schema=False)
@_guarded("queues")
async def dlq_redrive(request: Request, identity: Identity, name: str) -> Response:
    """Without ``confirm``: a dry run, shown as a preview with a confirm button."""
    from sluice.ops.deadletters import MAX_REDRIVE

    form = await _form(request, ("ids", "scope", "confirm"))
    scope, ids = _chosen(form)
    confirm = form.flag("confirm")
    if not confirm:
        await run_in_threadpool(preview, request)
    limit = MAX_REDRIVE if ids is None else max(1, min(len(ids), MAX_REDRIVE))
    result = await run_in_threadpool(
        lambda: _dead_letters(_services(request)).redrive(
            name, ids=ids, limit=limit, dry_run=not confirm, actor=identity.subject))
    return _page(request, "dlq_action.html", identity=identity, action="redrive", queue=name,
                 scope=scope, ids=ids or [], result=result, confirmed=confirm,
                 title=f"Redrive · {name}" + ("" if confirm else " · preview"))


@router.post("/admin/dlq/{name}/purge", name="dlq:purge", include_in_schema=False)
@_guarded("queues")
async def dlq_purge(request: Request, identity: Identity, name: str) -> Response:
    """Without ``confirm``: what would be deleted, with a confirm button."""
    form = await _form(request, ("ids", "scope", "confirm"))
    scope, ids = _chosen(form)
    dead = _dead_letters(_services(request))
    if not form.flag("confirm"):
        await run_in_threadpool(preview, request)
        depth = await run_in_threadpool(dead.depth, name)
        return _page(request, "dlq_action.html", identity=identity, action="purge", queue=name,
                     scope=scope, ids=ids or [], depth=depth, result=None, confirmed=False,
                     title=f"Purge · {name} · confirm")
    result = await run_in_threadpool(
        lambda: dead.purge(name, ids=ids, actor=identity.subject))
    return _page(request, "dlq_action.html", identity=identity, action="purge", queue=name,
                 scope=scope, ids=ids or [], result=result, confirmed=True,
                 title=f"Purge · {name}")


# --- jobs ----------------------------------------------------------------------------------


@router.get("/admin/jobs", name="console:jobs", include_in_schema=False)
@_guarded("queues")
async def jobs_page(request: Request, identity: Identity) -> Response:
    _params(request, ())
    data = await run_in_threadpool(model.jobs, _services(request))
    return _page(request, "jobs.html", identity=identity, title="Jobs", data=data, refresh=True)


@router.get("/api/admin/console/jobs", name="console:jobs.json")
@_twin("queues")
async def jobs_json(request: Request, identity: Identity) -> dict[str, Any]:
    _params(request, ())
    return await run_in_threadpool(model.jobs, _services(request))


def _job_surface(request: Request) -> Surface:
    from sluice.jobs.registry import get_job

    return get_job(request.path_params["name"]).surface


# "Run now" hands the run to the job's function (``<job>:handoff``); the run itself is the
# job's admin POST there, audited by that function as ``<job>:admin``.
ACTION_OF["console:jobs.run"] = lambda request: f"{request.path_params.get('name')}:handoff"


@router.post("/admin/jobs/{name}/run", name="console:jobs.run", include_in_schema=False)
@_guarded(_job_surface)
async def job_run(request: Request, identity: Identity, name: str) -> Response:
    """Run a job now, after a confirmation page: the run is handed to the job's own function
    (its whole time, not the HTTP function's 30 s) and shown on its run page until it ends."""
    from sluice.jobs.handoff import hand_off
    from sluice.jobs.registry import get_job

    job = get_job(name)
    form = await _form(request, ("confirm",))
    if not form.flag("confirm"):
        await run_in_threadpool(preview, request)
        return _page(request, "job_run.html", identity=identity, job=job, run=None,
                     handed=None, title=f"Run {name} now?")
    handed = await run_in_threadpool(lambda: hand_off(
        job, _services(request), token=admin_token(request), source_ip=client_ip(request)))
    return _secure(RedirectResponse(f"/admin/jobs/{name}/runs/{handed.run_id}",
                                    status_code=303))


@router.get("/admin/jobs/{name}/runs/{run_id}", name="console:jobs.run_page",
            include_in_schema=False)
@_guarded("queues")
async def job_run_page(request: Request, identity: Identity, name: str, run_id: str) -> Response:
    """A handed-off run: waiting for the job's function, running, or its result."""
    _params(request, ())
    data = await run_in_threadpool(model.job_run, _services(request), name, run_id)
    run = data["run"]
    ended = run is not None and run["outcome"] != "running"
    title = f"{name}: {run['outcome']}" if ended else f"{name}: {data['state']}"
    return _page(request, "job_run.html", identity=identity, job=data["job"], run=run,
                 handed=data, title=title, refresh=not ended, refresh_s=3,
                 body=json.dumps(run["result"], indent=2, default=json_default) if ended
                 else None)


@router.get("/api/admin/console/jobs/{name}/runs/{run_id}", name="console:jobs.run_json")
@_twin("queues")
async def job_run_json(request: Request, identity: Identity, name: str,
                       run_id: str) -> dict[str, Any]:
    _params(request, ())
    data = await run_in_threadpool(model.job_run, _services(request), name, run_id)
    return {key: value for key, value in data.items() if key != "job"}


# A schedule switched off on purpose, marked from the console: the API's action names.
ACTION_OF["console:jobs.disable"] = lambda request: f"{request.path_params.get('name')}:disable"
ACTION_OF["console:jobs.enable"] = lambda request: f"{request.path_params.get('name')}:enable"


@router.post("/admin/jobs/{name}/disable", name="console:jobs.disable", include_in_schema=False)
@_guarded(_job_surface)
async def job_disable(request: Request, identity: Identity, name: str) -> Response:
    """Mark the job's schedule as disabled on purpose (a reason is required)."""
    from sluice.jobs.overdue import DisabledMarks
    from sluice.jobs.registry import get_job

    job = get_job(name)
    form = await _form(request, ("reason",))
    marks = DisabledMarks(_services(request).db)
    await run_in_threadpool(lambda: marks.mark_disabled(
        job.name, reason=form.get("reason").strip(), actor=identity.subject, now=utcnow()))
    return _secure(RedirectResponse(f"/admin/jobs#job-{job.name}", status_code=303))


@router.post("/admin/jobs/{name}/enable", name="console:jobs.enable", include_in_schema=False)
@_guarded(_job_surface)
async def job_enable(request: Request, identity: Identity, name: str) -> Response:
    from sluice.jobs.overdue import DisabledMarks
    from sluice.jobs.registry import get_job

    job = get_job(name)
    await _form(request, ())
    await run_in_threadpool(DisabledMarks(_services(request).db).mark_enabled, job.name)
    return _secure(RedirectResponse(f"/admin/jobs#job-{job.name}", status_code=303))


# --- flags ---------------------------------------------------------------------------------


def _flags(services: Services) -> dict[str, Any]:
    from sluice.store.flags import FlagStore

    return {"flags": FlagStore(services.state).all()}


@router.get("/admin/flags", name="console:flags", include_in_schema=False)
@_guarded("flags")
async def flags_page(request: Request, identity: Identity) -> Response:
    params = _params(request, ("saved",))
    data = await run_in_threadpool(_flags, _services(request))
    return _page(request, "flags.html", identity=identity, title="Flags", data=data,
                 saved=params.get("saved"))


@router.post("/admin/flags", name="flags:set", include_in_schema=False)
@_guarded("flags")
async def flags_set(request: Request, identity: Identity) -> Response:
    from sluice.rss.store import RssStore
    from sluice.store.flags import FlagStore, get_flag

    form = await _form(request, ("key", "enabled", "tenantScopeId", "clearOverride", "confirm"))
    body: dict[str, Any] = {"key": form.get("key")}
    tenant = form.get("tenantScopeId").strip()
    if tenant:
        body["tenantScopeId"] = tenant
    if form.flag("clearOverride"):
        body["clearOverride"] = True
    else:
        if form.get("enabled") not in ("true", "false"):
            raise RequestError("enabled must be true or false")
        body["enabled"] = form.get("enabled") == "true"
    if not tenant and not form.flag("confirm"):  # the global switch: confirm first
        flag = get_flag(body["key"])
        await run_in_threadpool(preview, request)
        return _page(request, "flag_confirm.html", identity=identity, flag=flag,
                     enabled=body["enabled"], title=f"Turn {flag.label} "
                     f"{'on' if body['enabled'] else 'off'} globally?")
    services = _services(request)
    store = FlagStore(services.state, scope_exists=RssStore(services.db).has_scope)
    await run_in_threadpool(store.apply, body, identity.subject)
    return _secure(RedirectResponse(f"/admin/flags?saved={body['key']}", status_code=303))


# --- erasure -------------------------------------------------------------------------------


def erasure_model(services: Services, status: str | None, limit: int) -> dict[str, Any]:
    from sluice.erasure.requests import ErasureStore, check_status

    store = ErasureStore(services.db)
    rows = store.list(status=check_status(status), limit=limit)
    return {"generatedAt": iso_z(utcnow()), "summary": store.summary(),
            "status": status, "requests": [r.to_json() for r in rows]}


def _erasure_params(request: Request) -> tuple[str | None, int]:
    params = _params(request, ("status", "limit"))
    return params.get("status") or None, _int(params, "limit", 100, 1, 500)


@router.get("/admin/erasure", name="console:erasure", include_in_schema=False)
@_guarded("erasure")
async def erasure_page(request: Request, identity: Identity) -> Response:
    status, limit = _erasure_params(request)
    data = await run_in_threadpool(erasure_model, _services(request), status, limit)
    return _page(request, "erasure.html", identity=identity, title="Erasure requests",
                 data=data, refresh=True)


@router.get("/api/admin/console/erasure", name="console:erasure.json")
@_twin("erasure")
async def erasure_json(request: Request, identity: Identity) -> dict[str, Any]:
    status, limit = _erasure_params(request)
    return await run_in_threadpool(erasure_model, _services(request), status, limit)


@router.post("/admin/erasure/{request_id_}/cancel", name="erasure:cancel",
             include_in_schema=False)
@_guarded("erasure")
async def erasure_cancel(request: Request, identity: Identity, request_id_: str) -> Response:
    from sluice.erasure.requests import ErasureStore

    form = await _form(request, ("confirm",))
    store = ErasureStore(_services(request).db)
    if not form.flag("confirm"):
        await run_in_threadpool(preview, request)
        current = await run_in_threadpool(store.get, request_id_)
        return _page(request, "erasure_action.html", identity=identity, action="cancel",
                     erasure=current.to_json(), preview=None, done=False,
                     title="Cancel erasure request?")
    current = await run_in_threadpool(store.cancel, request_id_)
    return _page(request, "erasure_action.html", identity=identity, action="cancel",
                 erasure=current.to_json(), preview=None, done=True,
                 title="Erasure request cancelled")


@router.post("/admin/erasure/{request_id_}/confirm", name="erasure:confirm",
             include_in_schema=False)
@_guarded("erasure")
async def erasure_confirm(request: Request, identity: Identity, request_id_: str) -> Response:
    """Without ``confirm``: the dry run (what would be purged per table)."""
    from sluice.erasure.purge import confirm as purge_now

    form = await _form(request, ("confirm",))
    really = form.flag("confirm")
    if not really:
        await run_in_threadpool(preview, request)
    current, outcome = await run_in_threadpool(
        lambda: purge_now(_services(request), request_id_, confirmed_by=identity.subject,
                          dry_run=not really))
    return _page(request, "erasure_action.html", identity=identity, action="confirm",
                 erasure=current.to_json(), preview=outcome.to_json(), done=really,
                 title="Purge now?" if not really else f"Erasure {outcome.status}")


# --- audit ---------------------------------------------------------------------------------


@router.get("/admin/audit", name="console:audit", include_in_schema=False)
@_guarded("audit")
async def audit_page(request: Request, identity: Identity) -> Response:
    from sluice.ops.audit import find, parse_filter

    params = _params(request, ("actor", "action", "target", "since", "until", "limit"))
    data = await run_in_threadpool(find, _services(request).db, parse_filter(params))
    return _page(request, "audit.html", identity=identity, title="Audit trail", data=data)


# --- deliveries ----------------------------------------------------------------------------


SHOWN_OK_DESTINATIONS = 50  # the busiest ok destinations shown
SHOWN_HELD_DESTINATIONS = 100  # the destinations of each state not ok shown (by key)


def deliveries_model(services: Services, status: str | None, channel: str | None,
                     limit: int, destination: str | None = None) -> dict[str, Any]:
    from sluice.delivery.destinations import check_key
    from sluice.delivery.store import DeliveryStore, check_status
    from sluice.ops import destinations as control

    store = DeliveryStore(services.db)
    rows = store.list(status=check_status(status), channel=channel, limit=limit,
                      destination=check_key(destination) if destination else None)
    pages = [control.view(services, control.Page(state, SHOWN_HELD_DESTINATIONS))
             for state in ("disabled", "paused", "failing")]
    return {"generatedAt": iso_z(utcnow()), "stats": store.stats(), "status": status,
            "channel": channel, "destination": destination,
            "entries": [r.to_json() for r in rows],
            "destinations": [d for page in pages for d in page["destinations"]]
            + control.busiest(services, SHOWN_OK_DESTINATIONS),
            "destinationsHeldNotShown": [page["destinations"][0]["state"] for page in pages
                                         if page["next"]]}


def _delivery_params(request: Request) -> tuple[str | None, str | None, int, str | None]:
    params = _params(request, ("status", "channel", "limit", "destination"))
    return (params.get("status") or None, params.get("channel") or None,
            _int(params, "limit", 100, 1, 500), params.get("destination") or None)


@router.get("/admin/deliveries", name="console:deliveries", include_in_schema=False)
@_guarded("delivery")
async def deliveries_page(request: Request, identity: Identity) -> Response:
    from sluice.delivery.replay import STATUSES

    status, channel, limit, destination = _delivery_params(request)
    data = await run_in_threadpool(deliveries_model, _services(request), status, channel, limit,
                                   destination)
    return _page(request, "deliveries.html", identity=identity, title="Deliveries", data=data,
                 replay_statuses=STATUSES, shown_held=SHOWN_HELD_DESTINATIONS, refresh=True)


@router.get("/api/admin/console/deliveries", name="console:deliveries.json")
@_twin("delivery")
async def deliveries_json(request: Request, identity: Identity) -> dict[str, Any]:
    status, channel, limit, destination = _delivery_params(request)
    return await run_in_threadpool(deliveries_model, _services(request), status, channel, limit,
                                   destination)


def delivery_entry_model(services: Services, entry_id: str) -> dict[str, Any]:
    """One entry and what holds it (``sluice.delivery.why``: the API's and the CLI's answer)."""
    from sluice.delivery.store import DeliveryStore
    from sluice.delivery.why import why

    answer = why(services, entry_id)
    entry = DeliveryStore(services.db).get(entry_id)
    return {"generatedAt": iso_z(utcnow()), "entry": entry.to_json(), "why": answer.to_json()}


@router.get("/admin/deliveries/entries/{entry_id}", name="console:deliveries.entry",
            include_in_schema=False)
@_guarded("delivery")
async def delivery_entry_page(request: Request, identity: Identity, entry_id: str) -> Response:
    _params(request, ())
    data = await run_in_threadpool(delivery_entry_model, _services(request), entry_id)
    return _page(request, "delivery_entry.html", identity=identity,
                 title=f"Delivery {entry_id}", data=data, refresh=True)


@router.get("/api/admin/console/deliveries/entries/{entry_id}",
            name="console:deliveries.entry.json")
@_twin("delivery")
async def delivery_entry_json(request: Request, identity: Identity,
                              entry_id: str) -> dict[str, Any]:
    _params(request, ())
    return await run_in_threadpool(delivery_entry_model, _services(request), entry_id)


# A destination's change from the console is the API's change of the same action.
ACTION_OF["console:destinations.change"] = \
    lambda request: f"delivery:destination_{request.path_params.get('action')}"
# What the console's form sends for each field of a change, as the API's JSON has it.
_FORM_VALUES: dict[str, Callable[[str], Any]] = {
    "limit": lambda raw: _number(raw), "clear": lambda raw: raw in ("1", "true", "on")}


def _number(raw: str) -> Any:
    try:
        return float(raw)
    except ValueError:
        return raw  # refused by the change's own check, naming the field


def _change_action(action: str) -> Any:
    from sluice.ops import destinations as control

    spec = control.ACTIONS.get(action)
    if spec is None:
        raise NotFound(f"no destination action {action!r}; known: {', '.join(control.ACTIONS)}")
    return spec


@router.get("/admin/deliveries/destinations/{action}", name="console:destinations.form",
            include_in_schema=False)
@_guarded("delivery")
async def destination_form(request: Request, identity: Identity, action: str) -> Response:
    """The inputs of a change (until, reason, rate) for one destination, then its preview."""
    from sluice.delivery.destinations import check_key
    from sluice.ops import destinations as control

    spec = _change_action(action)
    key = check_key(_params(request, ("key",)).get("key") or "")
    current = await run_in_threadpool(control.describe, _services(request), key)
    return _page(request, "destination_action.html", identity=identity, action=action,
                 spec=spec, key=key, current=current, answer=None, values={},
                 title=f"{action.capitalize()} {key}")


@router.post("/admin/deliveries/destinations/{action}", name="console:destinations.change",
             include_in_schema=False)
@_guarded("delivery")
async def destination_change(request: Request, identity: Identity, action: str) -> Response:
    """Preview a destination's change (what it would do, nothing changed, no audit row);
    with ``confirm``, do it: one audit row with the change and until when."""
    from sluice.http.app import note_audit
    from sluice.ops import destinations as control

    spec = _change_action(action)
    form = await _form(request, ("key", "confirm", *spec.fields))
    values = {name: form.get(name) for name in spec.fields if form.get(name)}
    body = {name: _FORM_VALUES.get(name, str)(value) for name, value in values.items()}
    change = control.parse_change(action, form.get("key") or "", body)
    services = _services(request)
    if not form.flag("confirm"):
        await run_in_threadpool(preview, request)
        answer = await run_in_threadpool(control.preview, services, change)
    else:
        note_audit(request, {"change": change.to_json()})
        answer = await run_in_threadpool(control.apply, services, change)
    return _page(request, "destination_action.html", identity=identity, action=action,
                 spec=spec, key=change.destination, current=answer["current"], answer=answer,
                 values=values, title=f"{action.capitalize()} {change.destination}"
                 + ("?" if answer["dryRun"] else ""))


# A replay from the console is the API's replay (one audit row with the filter and count).
ACTION_OF["console:deliveries.replay"] = lambda request: "delivery:replay"


@router.post("/admin/deliveries/replay", name="console:deliveries.replay",
             include_in_schema=False)
@_guarded("delivery")
async def deliveries_replay(request: Request, identity: Identity) -> Response:
    """Replay a destination's window: the form's filter first shows the dry run (how many
    would go, how many the receiver already acknowledged); ``confirm`` replays it."""
    from sluice.delivery.channels import Outbound, channels
    from sluice.delivery.replay import FIELDS, Replay, ReplayReport, parse_filter
    from sluice.http.app import note_audit

    form = await _form(request, (*FIELDS, "confirm"))
    values = {name: form.get(name) for name in FIELDS if form.get(name)}
    flt = parse_filter(values, channels=list(channels()))
    confirmed = form.flag("confirm")
    if not confirmed:
        await run_in_threadpool(preview, request)
    services = _services(request)

    def run() -> ReplayReport:
        with Outbound.open(services.settings) as client:
            return Replay.from_services(services, client).run(
                flt, dry_run=not confirmed,
                progress=lambda report: note_audit(request, report.to_json()))

    report = (await run_in_threadpool(run)).to_json()
    return _page(request, "delivery_replay.html", identity=identity, report=report,
                 values=values, title="Replay deliveries" if confirmed else "Replay deliveries?")


@router.post("/admin/deliveries/{action}", name="console:deliveries.action",
             include_in_schema=False)
@_guarded("delivery")
async def deliveries_action(request: Request, identity: Identity, action: str) -> Response:
    """``redrive`` / ``purge`` one failed entry (``id``) or every failed one (of ``channel``);
    ``mark-delivered`` / ``send-again`` one entry resting unknown (``purge`` takes it too)."""
    from sluice.delivery.store import DeliveryStore

    if action not in ("redrive", "purge", *UNKNOWN_ACTIONS):
        raise NotFound(f"no delivery action {action!r}")
    from sluice.delivery.destinations import check_key

    form = await _form(request, ("id", "channel", "destination", "confirm"))
    entry_id, channel = form.get("id") or None, form.get("channel") or None
    destination = check_key(form.get("destination")) if form.get("destination") else None
    if action in UNKNOWN_ACTIONS and not entry_id:
        raise RequestError(f"{action} needs an entry id", field="id")
    if destination is not None and (action != "redrive" or entry_id):
        raise RequestError("only a redrive of every failed entry takes a destination",
                           field="destination")
    store = DeliveryStore(_services(request).db)
    if not form.flag("confirm"):
        await run_in_threadpool(preview, request)
        count = 1 if entry_id else await run_in_threadpool(
            lambda: store.count_failed(channel=channel, destination=destination))
        return _page(request, "delivery_action.html", identity=identity, action=action,
                     entry_id=entry_id, channel=channel, destination=destination, count=count,
                     done=None, title=f"{action.capitalize()} deliveries?")

    def act() -> int:
        if action in UNKNOWN_ACTIONS and entry_id:
            getattr(store, UNKNOWN_ACTIONS[action])(entry_id)
            return 1
        if entry_id:
            (store.redrive if action == "redrive" else store.purge)(entry_id)
            return 1
        if action == "redrive":
            return store.redrive_all(channel=channel, destination=destination)
        return store.purge_all(channel=channel)

    done = await run_in_threadpool(act)
    return _page(request, "delivery_action.html", identity=identity, action=action,
                 entry_id=entry_id, channel=channel, destination=destination, count=done,
                 done=done, title=f"Deliveries {action}")


UNKNOWN_ACTIONS = {"mark-delivered": "mark_delivered", "send-again": "send_again"}


# Every console route checks its query string with ``_params`` (names and repeats).
checked_by_handler(router.routes)
