from __future__ import annotations

import pytest

from sluice.core.errors import ConfigurationError
from sluice.store.db import Queries, _to_pyformat, open_database


def test_params_become_pyformat_outside_literals_only() -> None:
    sql = "SELECT 'a:b', x::text FROM t WHERE k = :key AND v LIKE '50%' AND w = :w_2"
    assert _to_pyformat(sql) == (
        "SELECT 'a:b', x::text FROM t WHERE k = %(key)s AND v LIKE '50%%' AND w = %(w_2)s")


def test_dialect_variants() -> None:
    queries = Queries.parse(
        "-- name: a\nSELECT 1\n\n-- name: a @postgres\nSELECT 2\n-- name: b\nSELECT 3;\n")
    assert queries.a.for_dialect("sqlite") == "SELECT 1"
    assert queries.a.for_dialect("postgres") == "SELECT 2"
    assert queries.b.for_dialect("postgres") == "SELECT 3"
    with pytest.raises(AttributeError):
        _ = queries.c


def test_a_dialect_only_query_needs_both() -> None:
    with pytest.raises(ConfigurationError):
        Queries.parse("-- name: a @postgres\nSELECT 2\n")


@pytest.mark.parametrize("url", ["mysql://x", "sqlite:relative.db", "sqlite://"])
def test_unknown_database_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigurationError):
        open_database(url)
