"""``:name`` parameters to psycopg's ``%(name)s``, by a tokenizer that knows SQL's lexical forms.

Only a ``:name`` in plain SQL text is a parameter. Left untouched: ``--`` and
``/* … */`` comments (nested, as Postgres allows), ``'…'`` strings (with ``''``
inside), ``E'…'`` strings (with backslash escapes), ``"…"`` identifiers,
``$tag$…$tag$`` bodies and ``::`` casts. Every ``%`` is doubled, since psycopg reads
the whole text as a format string.
"""

from __future__ import annotations

import re
from functools import cache

from sluice.core.errors import ConfigurationError

_NAME = re.compile(r"[A-Za-z_]\w*")
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_]\w*)?\$")


def _skip_quoted(sql: str, i: int, quote: str, *, backslash: bool = False) -> int:
    """Index just past the literal opened at ``sql[i]`` (a doubled quote stays inside)."""
    j = i + 1
    while j < len(sql):
        ch = sql[j]
        if backslash and ch == "\\":
            j += 2
            continue
        if ch == quote:
            if j + 1 < len(sql) and sql[j + 1] == quote:
                j += 2
                continue
            return j + 1
        j += 1
    raise ConfigurationError(f"unterminated {quote} literal in SQL: {sql[i:i + 40]!r}")


def _skip_block_comment(sql: str, i: int) -> int:
    depth, j = 0, i
    while j < len(sql):
        if sql.startswith("/*", j):
            depth += 1
            j += 2
        elif sql.startswith("*/", j):
            depth -= 1
            j += 2
            if depth == 0:
                return j
        else:
            j += 1
    raise ConfigurationError(f"unterminated comment in SQL: {sql[i:i + 40]!r}")


@cache
def to_pyformat(sql: str) -> str:
    """``:name`` -> ``%(name)s`` in plain SQL text only; ``%`` doubled everywhere."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end < 0 else end
        elif ch == "/" and sql.startswith("/*", i):
            end = _skip_block_comment(sql, i)
        elif ch in "eE" and sql.startswith("'", i + 1) and not (i and (sql[i - 1].isalnum()
                                                                      or sql[i - 1] == "_")):
            end = _skip_quoted(sql, i + 1, "'", backslash=True)
        elif ch in "'\"":
            end = _skip_quoted(sql, i, ch)
        elif ch == "$" and (tag := _DOLLAR_TAG.match(sql, i)) and not (
                i and (sql[i - 1].isalnum() or sql[i - 1] == "_")):
            close = sql.find(tag.group(), tag.end())
            if close < 0:
                raise ConfigurationError(f"unterminated {tag.group()} body in SQL")
            end = close + len(tag.group())
        elif ch == ":" and sql.startswith("::", i):
            end = i + 2
        elif ch == ":" and (name := _NAME.match(sql, i + 1)):
            out.append(f"%({name.group()})s")
            i = name.end()
            continue
        else:
            out.append("%%" if ch == "%" else ch)
            i += 1
            continue
        out.append(sql[i:end].replace("%", "%%"))
        i = end
    return "".join(out)
