"""Strict query strings and JSON bodies: known names only, each at most once, exact booleans.

Every route's accepted query parameters are the ones it declares: its FastAPI
parameters (``limit: int = 100``) and, for routes that read the query string
themselves (the job routes), the ``parameters`` of its ``openapi_extra`` — so
the OpenAPI document and the check are one table. A name the route does not
declare, a name given twice, or a boolean other than ``true`` / ``false`` is a
``400`` naming the parameter: a parameter that is not honoured is never ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import Request
from fastapi.dependencies.models import Dependant

from sluice.core.errors import RequestError
from sluice.core.query import QueryParam, check_query


def openapi_query(params: Iterable[QueryParam]) -> dict[str, Any]:
    """``openapi_extra`` declaring query parameters a route reads itself."""
    out = []
    for p in params:
        schema: dict[str, Any] = {"type": p.kind} if p.kind != "any" else {}
        if p.minimum is not None:
            schema["minimum"] = p.minimum
        if p.maximum is not None:
            schema["maximum"] = p.maximum
        out.append({"name": p.name, "in": "query", "required": False, "schema": schema})
    return {"parameters": out}


def _from_dependant(dependant: Dependant) -> Iterable[QueryParam]:
    stack = [dependant]
    while stack:
        current = stack.pop()
        for field in current.query_params:
            kind = "boolean" if field.field_info.annotation is bool else "any"
            yield QueryParam(field.alias, kind)
        stack.extend(current.dependencies)


def _from_openapi(extra: Mapping[str, Any] | None) -> Iterable[QueryParam]:
    for item in (extra or {}).get("parameters", []):
        if item.get("in") == "query":
            schema = item.get("schema", {})
            yield QueryParam(item["name"], schema.get("type", "any"), schema.get("minimum"),
                             schema.get("maximum"))


def declared_query(route: Any) -> dict[str, QueryParam]:
    """The query parameters ``route`` accepts (cached on the route object)."""
    cached: dict[str, QueryParam] | None = getattr(route, "_sluice_query", None)
    if cached is None:
        found: list[QueryParam] = []
        dependant = getattr(route, "dependant", None)
        if dependant is not None:
            found.extend(_from_dependant(dependant))
        found.extend(_from_openapi(getattr(route, "openapi_extra", None)))
        cached = {p.name: p for p in found}
        route._sluice_query = cached
    return cached


def strict_query(request: Request) -> None:
    """App-wide dependency: the query string against the matched route's declaration
    (routes marked by ``checked_by_handler`` call ``check_query`` themselves)."""
    route = request.scope.get("route")
    if route is not None and not getattr(route, "_sluice_query_by_handler", False):
        check_query(request.query_params.multi_items(), declared_query(route))


def checked_by_handler(routes: Iterable[Any]) -> None:
    """Mark routes whose handlers check the query string against their own list."""
    for route in routes:
        route._sluice_query_by_handler = True


def check_names(items: Iterable[tuple[str, str]], accepted: Iterable[str]) -> None:
    """``check_query`` for parameters whose values the handler parses itself."""
    check_query(items, {name: QueryParam(name, "any") for name in accepted})


def known_fields(body: Mapping[str, Any], accepted: Iterable[str]) -> None:
    """A JSON object body may hold only ``accepted`` keys."""
    allowed = set(accepted)
    unknown = set(body) - allowed
    if unknown:
        raise RequestError(f"unknown field(s): {', '.join(sorted(unknown))}; "
                           f"accepted: {', '.join(sorted(allowed))}")
