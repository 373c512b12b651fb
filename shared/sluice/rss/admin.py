"""Validated admin operations on sources and scopes, shared by the HTTP API and the CLI.

Bad input is a ``RequestError`` naming the field: an unknown source id in a scope, a
feed URL that is not http(s), or one whose address is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sluice.core.errors import RequestError
from sluice.core.validate import (
    check_identifier,
    check_locale,
    check_optional_text,
    check_scope_id,
    check_url,
)
from sluice.egress import AddressGuard
from sluice.rss.catalog import peek_scope
from sluice.rss.fetch import feed_guard
from sluice.rss.store import RssStore, Scope, Source

if TYPE_CHECKING:
    from sluice.core.services import Services

MAX_SOURCES_PER_SCOPE = 500
MAX_STORIES = 500


def _field(body: dict[str, Any], name: str, kind: type, required: bool) -> Any:
    value = body.get(name)
    if value is None:
        if required:
            raise RequestError(f"{name} is required", field=name)
        return None
    if not isinstance(value, kind) or (isinstance(value, str) and not value.strip()):
        raise RequestError(f"{name} must be a {'non-empty string' if kind is str else kind.__name__}",
                           field=name)
    return value


# What each body may hold (the API's description lists the same: sluice.http.models).
SOURCE_FIELDS = frozenset({"url", "title", "global"})
SCOPE_FIELDS = frozenset({"tenantId", "sourceIds", "locale", "completed"})


def _only(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(f"unknown field {unknown[0]}", field=unknown[0])
    return body


def add_source(services: Services, body: Any, guard: AddressGuard | None = None) -> Source:
    body = _only(body, SOURCE_FIELDS)
    url = check_url(_field(body, "url", str, True), field="url")
    title = check_optional_text(body.get("title"), field="title")
    is_global = _field(body, "global", bool, False) or False
    guard = guard or feed_guard(services.settings.feed_allow_hosts)
    guard.check_url(url, resolve=False)
    return RssStore(services.db).add_source(url, title, is_global)


def put_scope(services: Services, scope_id: str, body: Any) -> Scope:
    check_scope_id(scope_id)
    body = _only(body, SCOPE_FIELDS)
    tenant = check_identifier(_field(body, "tenantId", str, True), field="tenantId")
    source_ids = _field(body, "sourceIds", list, True)
    locale = check_locale(_field(body, "locale", str, True))
    completed = _field(body, "completed", bool, False)
    if not source_ids or not all(isinstance(s, str) and s for s in source_ids):
        raise RequestError("sourceIds must be a non-empty list of source ids", field="sourceIds")
    if len(source_ids) > MAX_SOURCES_PER_SCOPE:
        raise RequestError(f"sourceIds holds at most {MAX_SOURCES_PER_SCOPE} ids",
                           field="sourceIds")
    for n, source_id in enumerate(source_ids):
        check_identifier(source_id, field=f"sourceIds[{n}]")
    store = RssStore(services.db)
    known = {s.id for s in store.sources_by_ids(source_ids)}
    unknown = sorted(set(source_ids) - known)
    if unknown:
        raise RequestError(f"unknown source ids: {', '.join(unknown)}", field="sourceIds",
                           unknown=unknown)
    ids = tuple(dict.fromkeys(source_ids))
    return store.put_scope(scope_id, tenant, ids, locale, True if completed is None else completed)


def scope_stories_body(services: Services, scope_id: str, raw_limit: str | None
                       ) -> dict[str, Any]:
    """``{scopeId, builtAt, stories}`` from the scope's stored build; never builds."""
    limit = 50
    if raw_limit is not None:
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_STORIES:
            raise RequestError(f"limit must be a whole number from 1 to {MAX_STORIES}",
                               field="limit")
        limit = int(raw_limit)
    RssStore(services.db).scope(scope_id)  # 404 for an unknown scope
    build = peek_scope(services, scope_id)
    return {"scopeId": scope_id, "builtAt": build.to_json()["builtAt"] if build else None,
            "stories": [s.to_json() for s in build.stories[:limit]] if build else []}
