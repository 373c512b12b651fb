"""``/admin/queues`` (a page) and ``/api/admin/queues`` (its JSON twin), on the queues surface."""

from __future__ import annotations

from html import escape
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool

from shared.core.auth import Identity
from shared.core.errors import Forbidden, Unauthorized
from shared.http.app import admin_token, require, services_of
from shared.ops.overview import queue_figures

router = APIRouter()

RESTRICTED = ("<h1>Queue monitoring access is restricted</h1><p>This operations surface is "
              "limited to platform users with queue monitoring access.</p>")


@router.get("/api/admin/queues")
def figures(request: Request, identity: Identity = require("queues")) -> dict[str, Any]:
    return queue_figures(services_of(request))


@router.get("/admin/queues", response_class=HTMLResponse)
async def page(request: Request) -> HTMLResponse:
    services = services_of(request)
    try:
        services.admin.authorize(admin_token(request), "queues")
    except (Unauthorized, Forbidden) as exc:
        return HTMLResponse(_layout(RESTRICTED), status_code=exc.status)
    data = await run_in_threadpool(queue_figures, services)
    return HTMLResponse(_layout(render(data)))


def _cell(value: Any) -> str:
    if isinstance(value, dict) and "error" in value:
        return f'<span class="error">{escape(str(value["error"]))}</span>'
    if value is None:
        return "—"
    return escape(str(value))


def _table(title: str, headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<h2>{escape(title)}</h2><table><tr>{head}</tr>{body}</table>"


def _get(section: Any, key: str) -> Any:
    return section.get(key) if isinstance(section, dict) and "error" not in section else section


def render(data: dict[str, Any]) -> str:
    parts = [f"<h1>Queue health</h1><p>Measured at {escape(data['generatedAt'])}.</p>"]
    topics = data["topics"]
    if isinstance(topics, list):
        rows = []
        for t in topics:
            for kind in ("queue", "dlq"):
                figures = t[kind]
                rows.append([t["topic"] if kind == "queue" else f"{t['topic']}-dlq", t["mode"],
                             _get(figures, "visible") if "inProcess" not in figures else "in process",
                             _get(figures, "inFlight"), _get(figures, "delayed"),
                             _get(figures, "depth"), _get(figures, "oldestAgeS")])
        parts.append(_table("Push topics", ["queue", "mode", "visible", "in flight", "delayed",
                                            "depth", "oldest age (s)"], rows))
    else:
        parts.append(_table("Push topics", ["error"], [[topics]]))
    ledger = data["ledgerRetry"]
    parts.append(_table("Ledger retry lists (Redis)", ["queue", "processing", "dead letters"],
                        [[_get(ledger, "queue"), _get(ledger, "processing"), _get(ledger, "dlq")]]))
    outbox = data["meteringOutbox"]
    parts.append(_table("Metering outbox", ["pending", "retrying", "exhausted", "processed",
                                            "oldest eligible"],
                        [[_get(outbox, k) for k in ("pending", "retrying", "exhausted",
                                                    "processed", "oldestEligibleAt")]]))
    delivery = data["delivery"]
    if isinstance(delivery, dict) and "error" not in delivery:
        parts.append(_table("Delivery queue", ["status", "count", "oldest"],
                            [[s, f["count"], f["oldest"]] for s, f in delivery.items()]))
    else:
        parts.append(_table("Delivery queue", ["error"], [[delivery]]))
    erasure = data["erasure"]
    parts.append(_table("Erasure requests", ["due now", "by status"],
                        [[_get(erasure, "due"), _get(erasure, "byStatus")]]))
    jobs = data["jobs"]
    if isinstance(jobs, list):
        parts.append(_table("Jobs", ["job", "schedule", "last run", "trigger", "outcome", "ms"], [
            [j["job"], j["schedule"], *(([j["lastRun"][k] for k in
                                          ("startedAt", "trigger", "outcome", "durationMs")])
                                        if j["lastRun"] else ["never", None, None, None])]
            for j in jobs]))
    return "".join(parts)


def _layout(body: str) -> str:
    return ("<!doctype html><html><head><meta charset='utf-8'><title>Sluice · Queue health</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:2rem;color:#222}"
            "table{border-collapse:collapse;margin-bottom:1.5rem}"
            "td,th{border:1px solid #ccc;padding:.3rem .6rem;text-align:left}"
            "th{background:#f3f3f3}.error{color:#b00}</style></head>"
            f"<body>{body}</body></html>")
