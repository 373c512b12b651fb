"""Strict query strings, without a web framework: known names only, each at most once,
exact booleans, whole numbers within bounds. The HTTP app (``sluice.http.params``) and the
Lambda Function URL of a job (``sluice.jobs.cron_url``) both check with ``check_query``,
so a parameter is refused the same way whichever door it came through."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from sluice.core.errors import RequestError

BOOLEANS = {"true": True, "false": False}


class QueryParam(NamedTuple):
    name: str
    kind: str  # "boolean" | "integer" | "any"
    minimum: int | None = None
    maximum: int | None = None


def parse_bool(name: str, value: str) -> bool:
    try:
        return BOOLEANS[value]
    except KeyError:
        raise RequestError(f"{name} must be true or false, got {value!r}",
                           parameter=name) from None


def _check_value(param: QueryParam, value: str) -> None:
    if param.kind == "boolean":
        parse_bool(param.name, value)
    elif param.kind == "integer":
        lo, hi = param.minimum, param.maximum
        if not value.isascii() or not value.isdigit() or (lo is not None and int(value) < lo) \
                or (hi is not None and int(value) > hi):
            raise RequestError(f"{param.name} must be a whole number from {lo} to {hi}, "
                               f"got {value!r}", parameter=param.name)


def check_query(items: Iterable[tuple[str, str]], accepted: Mapping[str, QueryParam]) -> None:
    seen: set[str] = set()
    for name, value in items:
        param = accepted.get(name)
        if param is None:
            known = ", ".join(sorted(accepted)) or "none"
            raise RequestError(f"unknown query parameter {name!r}; this route accepts: {known}",
                               parameter=name)
        if name in seen:
            raise RequestError(f"query parameter {name!r} is given more than once",
                               parameter=name)
        seen.add(name)
        _check_value(param, value)


__all__ = ["BOOLEANS", "QueryParam", "check_query", "parse_bool"]
