"""A statement's work, measured as work rather than time (for the tests that hold a query
flat as its table grows): the steps SQLite's virtual machine takes running it."""

from __future__ import annotations

import sqlite3
from typing import Any


def sqlite_steps(path: str, sql: str, params: dict[str, Any], *,
                 every: int = 1) -> tuple[int, list[Any]]:
    """Run ``sql`` on its own connection to the SQLite file ``path``, counting its virtual
    machine's steps (one count per ``every`` instructions); what it did is rolled back.
    The count and the rows it returned."""
    conn = sqlite3.connect(path)
    try:
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        conn.set_progress_handler(count, every)
        rows = conn.execute(sql, params).fetchall()
        conn.set_progress_handler(None, every)
        conn.rollback()
    finally:
        conn.close()
    return steps[0], rows
