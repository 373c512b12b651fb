"""Admin API for alert rules (surface ``alerts``: roles super_admin, ops).

``GET|PUT /api/admin/alerts/rules/{scopeId}``: a scope's whole rule list, replaced
whole on ``PUT`` after validation (a 400 names the field). Writes are audited by the
app's middleware; a query parameter is a 400 (the app's strict query check).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request

from sluice.alerts.rules import RulesStore, rules_body
from sluice.core.auth import Identity
from sluice.http.app import require, services_of

router = APIRouter(prefix="/api/admin/alerts", tags=["alerts"])
JSON_BODY = Body(...)


@router.get("/rules/{scope_id}", name="alerts:rules_show")
def show_rules(request: Request, scope_id: str,
               identity: Identity = require("alerts")) -> dict[str, Any]:
    return rules_body(scope_id, RulesStore(services_of(request)).get(scope_id))


@router.put("/rules/{scope_id}", name="alerts:rules_set")
def set_rules(request: Request, scope_id: str, body: Any = JSON_BODY,
              identity: Identity = require("alerts")) -> dict[str, Any]:
    return rules_body(scope_id, RulesStore(services_of(request)).put(scope_id, body))
