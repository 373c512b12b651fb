"""Feature flags in the state store, with per-tenant overrides.

One row per flag (``platform:flags:<key>``) and one per override
(``platform:flags:<key>:tenant:<tenantScopeId>``), so writers never
read-modify-write a shared value.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from shared.core.errors import NotFound, RequestError
from shared.store.state import StateStore

PREFIX = "platform:flags:"


class Flag(NamedTuple):
    key: str
    label: str
    default: bool
    description: str


FLAGS: dict[str, Flag] = {
    flag.key: flag
    for flag in (
        Flag("rssQueuePipeline", "RSS queue pipeline", False,
             "rss-refresh publishes to rss.ingest instead of refreshing the global catalog "
             "inline; the rss.ingest consumer re-checks it and acknowledges without work when off"),
    )
}


class UnknownFlag(NotFound):
    """No flag has that key."""

    code = "unknown_flag"


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
    def __init__(self, state: StateStore) -> None:
        self.state = state

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
                "overrides": self.overrides(key)}

    def all(self) -> list[dict[str, Any]]:
        return [self.describe(key) for key in FLAGS]

    def apply(self, body: Any, actor: str | None = None) -> dict[str, Any]:
        """``{key, enabled, tenantScopeId?, clearOverride?}`` (the PUT body and the CLI)."""
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        key = body.get("key")
        if not isinstance(key, str):
            raise RequestError("key is required")
        tenant = body.get("tenantScopeId")
        if tenant is not None and (not isinstance(tenant, str) or not tenant.strip()):
            raise RequestError("tenantScopeId must be a non-empty string")
        if body.get("clearOverride") is True:
            if tenant is None:
                raise RequestError("clearOverride needs a tenantScopeId")
            self.clear_override(key, tenant)
        else:
            enabled = body.get("enabled")
            if not isinstance(enabled, bool):
                raise RequestError("enabled must be true or false")
            self.set(key, enabled, tenant, actor)
        return self.describe(key)
