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

from sluice.delivery.replay import STATUSES
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


class DeliveryReplay(BaseModel):
    """``POST /api/admin/delivery/replay``: a destination's window sent again (docs/delivery.md,
    Replay by destination and window)."""

    model_config = ConfigDict(extra="forbid")

    destination: str = Field(description="a destination's key (webhook:<URL>, "
                                         "telegram:<chat>, slack:<channel>, email:<address>)"
                                         " or a receiver's (webhook:<host>:<port>, the port "
                                         "always written: 443, 80; email:smtp)")
    channel: str | None = Field(None, description="only this channel's entries")
    since: str = Field(description="ISO 8601 with offset: entries enqueued from then")
    until: str | None = Field(None, description="ISO 8601 with offset, before then "
                                                "(default now; at most 31 days after since)")
    status: str | None = Field(None, description=f"what to replay: {', '.join(STATUSES)} "
                                                 "(default failed; acked ones only when asked)")
    after: str | None = Field(None, description="an entry's id: of the entries enqueued at "
                                                "since, only those after it (a replay's "
                                                "next.after)")
    dryRun: bool | None = Field(None, description="count, change nothing (not audited)")


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


class FlagChange(BaseModel):
    """``PUT /api/admin/flags``: set a flag, or a tenant's override of it, or clear one."""

    model_config = ConfigDict(extra="forbid")

    key: str
    enabled: bool | None = None
    tenantScopeId: str | None = Field(None, description="a per-tenant override for this scope (400 override_not_honoured for a flag read only globally, which overridesTakeEffect: false marks; clearOverride still removes one)")
    clearOverride: bool | None = Field(None, description="true: remove the tenant's override")


class DeadLetterRedrive(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[str] | None = Field(None, description="these dead letters (default: the oldest)")
    limit: int | None = Field(None, description="at most this many (max 100)")
    dryRun: bool | None = Field(None, description="say what would be redriven, change nothing")


class DeadLetterPurge(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[str] | None = None
    all: bool | None = Field(None, description="true: purge every dead letter of the queue")


class FeedSource(BaseModel):
    """``POST /api/admin/rss/sources``."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="the feed's http(s) URL")
    title: str | None = None
    global_: bool | None = Field(None, alias="global",
                                 description="in the global catalog scope")


class FeedScope(BaseModel):
    """``PUT /api/admin/rss/scopes/{scope_id}``."""

    model_config = ConfigDict(extra="forbid")

    tenantId: str
    sourceIds: list[str]
    locale: str = Field(description="a language tag such as en or pt-BR")
    completed: bool | None = None


# Models named by a route's ``request_body`` (the route reads its body itself, so FastAPI
# does not see them); the OpenAPI document lists each under components.
BODIES: dict[str, type[BaseModel]] = {}


def request_body(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` declaring ``model`` as the route's JSON body (``apidocs.describe``
    puts it in place of what FastAPI infers)."""
    BODIES[model.__name__] = model
    return {"x-sluice-body": {"model": model.__name__, "required": required}}
