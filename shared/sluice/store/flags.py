"""Feature flags in the state store, with per-tenant overrides.

One row per flag (``platform:flags:<key>``) and one per override
(``platform:flags:<key>:tenant:<tenantScopeId>``), so writers never
read-modify-write a shared value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from sluice.core.errors import NotFound, RequestError, SluiceError
from sluice.core.validate import check_scope_id
from sluice.store.state import StateStore

PREFIX = "platform:flags:"
# The audit action of every flag change (set, or clear an override), on every surface.
# What a flag change may hold (the API's description lists the same: sluice.http.models).
FLAG_FIELDS = frozenset({"key", "enabled", "tenantScopeId", "clearOverride"})
FLAG_ACTION = "flags:set"


class AuditTrail(Protocol):
    """Where a change is recorded: a row written before it, settled after it."""

    def audit(self, *, actor: str, action: str, target: str | None, outcome: str,
              ip: str | None, detail: dict[str, Any] | None = None) -> str: ...

    def complete_audit(self, audit_id: str, outcome: str,
                       detail: dict[str, Any] | None = None) -> None: ...


class Flag(NamedTuple):
    key: str
    label: str
    default: bool
    description: str
    # Why a per-tenant override would change nothing where the flag is read (None: it
    # would): such a flag refuses a new override (a parameter it cannot honour), and an
    # override stored before can only be cleared.
    override_note: str | None = None


FLAGS: dict[str, Flag] = {
    flag.key: flag
    for flag in (
        Flag("rssQueuePipeline", "RSS queue pipeline", False,
             "rss-refresh publishes to rss.ingest instead of refreshing the global catalog "
             "inline, and fans the due tenant builds out as one rss.ingest message per build "
             "key, which the consumers build (only keys it could not publish are built "
             "inline); the rss.ingest consumer re-checks it and acknowledges without work "
             "when off",
             override_note=(
                 "the flag is read once per tick, and by each rss.ingest message, globally: "
                 "when on, every tenant's due builds go to the queue together (a build key "
                 "serves every scope on it, so one tenant cannot opt out alone); a new override "
                 "is refused, and one stored before can only be cleared")),
    )
}


class UnknownFlag(NotFound):
    """No flag has that key."""

    code = "unknown_flag"


class OverrideRefused(RequestError):
    """A per-tenant override of a flag that is only read globally."""

    code = "override_not_honoured"


def get_flag(key: str) -> Flag:
    try:
        return FLAGS[key]
    except KeyError:
        raise UnknownFlag(f"unknown flag {key!r}; known: {', '.join(sorted(FLAGS))}") from None


def _global_key(key: str) -> str:
    return f"{PREFIX}{key}"


def _override_key(key: str, tenant_scope_id: str) -> str:
    return f"{PREFIX}{key}:tenant:{tenant_scope_id}"


class FlagStore:
    def __init__(self, state: StateStore,
                 scope_exists: Callable[[str], bool] | None = None) -> None:
        """``scope_exists``: whether a tenant scope id is known; an override naming an
        unknown one is refused (without it, overrides cannot be set)."""
        self.state = state
        self.scope_exists = scope_exists

    def _stored(self, name: str) -> bool | None:
        value = self.state.get(name)
        if isinstance(value, dict) and isinstance(value.get("enabled"), bool):
            return bool(value["enabled"])
        return None

    def enabled(self, key: str, tenant_scope_id: str | None = None) -> bool:
        """The tenant's override if it has one, else the global value, else the default."""
        flag = get_flag(key)
        if tenant_scope_id:
            override = self._stored(_override_key(key, tenant_scope_id))
            if override is not None:
                return override
        stored = self._stored(_global_key(key))
        return flag.default if stored is None else stored

    def overrides(self, key: str) -> dict[str, bool]:
        prefix = _override_key(key, "")
        found = {}
        for name in self.state.keys_with_prefix(prefix):
            value = self._stored(name)
            if value is not None:
                found[name.removeprefix(prefix)] = value
        return found

    def set(self, key: str, enabled: bool, tenant_scope_id: str | None = None,
            actor: str | None = None) -> None:
        get_flag(key)
        name = _override_key(key, tenant_scope_id) if tenant_scope_id else _global_key(key)
        self.state.put(name, {"enabled": enabled})  # who: the admin audit trail

    def clear_override(self, key: str, tenant_scope_id: str) -> bool:
        get_flag(key)
        return self.state.delete(_override_key(key, tenant_scope_id))

    def describe(self, key: str) -> dict[str, Any]:
        flag = get_flag(key)
        stored = self._stored(_global_key(key))
        return {"key": flag.key, "label": flag.label, "description": flag.description,
                "default": flag.default, "enabled": flag.default if stored is None else stored,
                "overrides": self.overrides(key),
                "overridesTakeEffect": flag.override_note is None,
                "overrideNote": flag.override_note}

    def all(self) -> list[dict[str, Any]]:
        return [self.describe(key) for key in FLAGS]

    def apply(self, body: Any, actor: str | None = None,
              audit: AuditTrail | None = None) -> dict[str, Any]:
        """``{key, enabled, tenantScopeId?, clearOverride?}`` (the PUT body and the CLI).

        With ``audit``, the change is recorded as ``FLAG_ACTION`` before it is made and
        settled after (the HTTP surface audits in its middleware and passes none)."""
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        unknown = set(body) - FLAG_FIELDS
        if unknown:
            raise RequestError(f"unknown field(s): {', '.join(sorted(unknown))}")
        key = body.get("key")
        if not isinstance(key, str):
            raise RequestError("key is required")
        if audit is None:
            return self._apply(body, key)
        detail = {"key": key, "enabled": body.get("enabled"),
                  "tenantScopeId": body.get("tenantScopeId"),
                  "clearOverride": body.get("clearOverride") is True}
        audit_id = audit.audit(actor=actor or "unknown", action=FLAG_ACTION, target=key,
                               outcome="started", ip=None, detail=detail)
        try:
            described = self._apply(body, key)
        except SluiceError as exc:
            audit.complete_audit(audit_id, exc.code, detail)
            raise
        audit.complete_audit(audit_id, "ok", detail)
        return described

    def _apply(self, body: dict[str, Any], key: str) -> dict[str, Any]:
        tenant = body.get("tenantScopeId")
        if tenant is not None:
            tenant = check_scope_id(tenant, field="tenantScopeId")
        if body.get("clearOverride") is True:
            if tenant is None:
                raise RequestError("clearOverride needs a tenantScopeId")
            self.clear_override(key, tenant)
        else:
            enabled = body.get("enabled")
            if not isinstance(enabled, bool):
                raise RequestError("enabled must be true or false")
            note = get_flag(key).override_note
            if tenant is not None and note is not None:
                raise OverrideRefused(f"an override of {key} would change nothing ({note}); "
                                      "set it globally", field="tenantScopeId")
            if tenant is not None and (self.scope_exists is None
                                       or not self.scope_exists(tenant)):
                raise RequestError(f"no tenant scope {tenant!r}: an override must name a "
                                   "scope that exists", field="tenantScopeId")
            self.set(key, enabled, tenant)
        return self.describe(key)
