"""The API's bodies as pydantic models: what ``/api/openapi.json`` describes, so a client can
be generated from it.

The models describe; they do not check. A request body is read as JSON and checked by the
door's table (``sluice.ops.door``), so the HTTP API refuses exactly what ``sluice.*`` and the
command line refuse, with the same 400 naming the field (a pydantic check would answer a
422 of its own words). ``request_body`` puts a model in a route's ``openapi_extra``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sluice.delivery.store import DeliveryStatus
from sluice.erasure.requests import ErasureStatus


class ErrorDetail(BaseModel):
    code: str = Field(description="the error's type: bad_request, unauthorized, forbidden, "
                                  "not_found, conflict, store_unavailable, ...")
    message: str
    field: str | None = Field(None, description="the input field refused, when one was")
    requestId: str | None = None


class ErrorBody(BaseModel):
    """Every refusal and failure: ``{"error": {...}}``."""

    error: ErrorDetail


class DeliveryRequest(BaseModel):
    """A message to store for delivery-drain (``sluice.enqueue_delivery``)."""

    model_config = ConfigDict(extra="forbid")

    channel: str = Field(description="webhook, slack, telegram or email")
    recipient: str = Field(description="the webhook URL, Slack channel, Telegram chat id or "
                                       "email address")
    payload: dict[str, Any] = Field(description="a text, or the channel's fields "
                                                "(docs/delivery.md)")
    idempotencyKey: str | None = Field(None, description="a repeat with this key stores "
                                                         "nothing and answers the first entry")
    subjectUserId: str | None = Field(None, description="the app user it is for (erasure)")


class DeliveryEntryBody(BaseModel):
    id: str
    channel: str
    recipient: str
    subjectUserId: str | None
    payload: dict[str, Any]
    idempotencyKey: str | None
    status: DeliveryStatus
    attempts: int
    nextAttemptAt: str | None
    leaseUntil: str | None
    lastError: str | None
    platformMessageId: str | None
    durationMs: int | None
    enqueuedAt: str | None
    updatedAt: str | None
    ackedAt: str | None
    failedAt: str | None
    failureReason: str | None
    unknownSends: int
    heldBy: str | None


class ErasureRequestBody(BaseModel):
    """An erasure request to open (``sluice.request_erasure``)."""

    model_config = ConfigDict(extra="forbid")

    subjectUserId: str = Field(description="the app's user id to erase")
    tenantId: str | None = None
    graceDays: int | None = Field(None, ge=0, le=365,
                                  description="default SLUICE_ERASURE_GRACE_DAYS; 0: due now")


class ErasureBody(BaseModel):
    id: str
    subjectUserId: str
    tenantId: str | None
    status: ErasureStatus
    requestedBy: str
    requestedAt: str | None
    graceUntil: str | None
    confirmedBy: str | None
    purgedAt: str | None
    verifiedAt: str | None
    result: dict[str, Any] | None
    lastError: str | None


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` declaring ``model`` as the route's (required) JSON body."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}
