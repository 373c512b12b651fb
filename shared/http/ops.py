"""``/api/admin/queues``: the operations figures as JSON, on the queues surface.

The page at ``/admin/queues`` is the console's overview (``shared/http/console``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from shared.core.auth import Identity
from shared.http.app import require, services_of
from shared.ops.overview import queue_figures

router = APIRouter()


@router.get("/api/admin/queues")
def figures(request: Request, identity: Identity = require("queues")) -> dict[str, Any]:
    return queue_figures(services_of(request))
