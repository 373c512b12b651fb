"""The ``:name`` rewrite for psycopg: a tokenizer, one case per SQL lexical form."""

from __future__ import annotations

import pytest

from sluice.core.errors import ConfigurationError
from sluice.store.db import open_database
from sluice.store.params import to_pyformat


@pytest.mark.parametrize(("sql", "expected"), [
    # an apostrophe in a line comment does not hide the parameters after it
    ("SELECT 1 -- the user's row\nWHERE a = :a AND b = :b",
     "SELECT 1 -- the user's row\nWHERE a = %(a)s AND b = %(b)s"),
    # nor in a block comment (nested, as Postgres allows)
    ("/* it's /* nested */ still */ SELECT :a", "/* it's /* nested */ still */ SELECT %(a)s"),
    # a doubled quote stays inside the literal; :x in it is text
    ("SELECT 'it''s :x' AS s, :y", "SELECT 'it''s :x' AS s, %(y)s"),
    # E'' strings escape with a backslash
    ("SELECT E'a\\'b :x', :y", "SELECT E'a\\'b :x', %(y)s"),
    # casts, after a parameter too
    ("SELECT :a::text, x::jsonb", "SELECT %(a)s::text, x::jsonb"),
    # a quoted identifier
    ('SELECT "we:ird" FROM t WHERE k = :k', 'SELECT "we:ird" FROM t WHERE k = %(k)s'),
    # a dollar-quoted body
    ("SELECT $$ it's :x $$, $f$ :y $f$, :z", "SELECT $$ it's :x $$, $f$ :y $f$, %(z)s"),
    # every % doubled, in literals and comments too
    ("SELECT '50%' -- 10%\n, :p", "SELECT '50%%' -- 10%%\n, %(p)s"),
])
def test_rewrite(sql: str, expected: str) -> None:
    assert to_pyformat(sql) == expected


def test_an_unterminated_literal_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        to_pyformat("SELECT 'oops")


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite:///:memory:"])
def test_in_memory_sqlite_is_refused_with_a_reason(url: str) -> None:
    with pytest.raises(ConfigurationError, match="in-memory SQLite"):
        open_database(url)
