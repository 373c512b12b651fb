"""``/api/admin/queues``: the operations figures as JSON, on the queues surface;
``/api/admin/audit``: the audit trail (``sluice.ops.audit``).

The page at ``/admin/queues`` is the console's overview (``shared/sluice/http/console``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from sluice.core.auth import Identity
from sluice.http.app import require, services_of
from sluice.ops.audit import DEFAULT_LIMIT, find, parse_filter
from sluice.ops.overview import queue_figures

router = APIRouter()


@router.get("/api/admin/audit", name="audit:list")
def audit(request: Request, actor: str | None = None, action: str | None = None,
          target: str | None = None, since: str | None = None, until: str | None = None,
          limit: int = DEFAULT_LIMIT, identity: Identity = require("audit")) -> dict[str, Any]:
    """The audit trail of actions, newest first: filters by actor, action, target (a
    prefix) and time (``since`` inclusive, ``until`` exclusive, ISO 8601 with offset)."""
    values = {"actor": actor, "action": action, "target": target, "since": since,
              "until": until, "limit": str(limit)}
    return find(services_of(request).db,
                parse_filter({k: v for k, v in values.items() if v is not None}))


@router.get("/api/admin/queues")
def figures(request: Request, identity: Identity = require("queues")) -> dict[str, Any]:
    return queue_figures(services_of(request))
