"""The simulated deployment's SQL store: SQLite (a scratch file), or Postgres (a database of
the seed's own on the server at ``SLUICE_SIM_PG_URL``, default 127.0.0.1:5432, made for the
run and dropped after it).

With ``--limits`` every third seed (``seed % 3 == 0``) runs on Postgres, so the published
run reaches both stores' SQL (the claim is one statement on Postgres, a loop on SQLite);
``--store`` sets one store for every seed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

Store = Literal["sqlite", "postgres"]
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def store_of(seed: int, limits: bool, chosen: str | None) -> Store:
    """The store a seed runs on: ``chosen`` when given, else Postgres for every third seed
    of ``--limits`` and SQLite otherwise."""
    if chosen in ("sqlite", "postgres"):
        return chosen  # type: ignore[return-value]
    return "postgres" if limits and seed % 3 == 0 else "sqlite"


@contextmanager
def database(store: Store, directory: Path, seed: int) -> Iterator[str]:
    """The run's database URL, made empty for it (and a Postgres one dropped after)."""
    if store == "sqlite":
        yield f"sqlite:///{directory}/sim.db"
        return
    import psycopg

    admin = os.environ.get("SLUICE_SIM_PG_URL", ADMIN_URL)
    name = f"sluice_sim_{seed}_{os.getpid()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
        # a scratch database: a commit need not wait for its flush (simulated time costs
        # only the work, as /dev/shm gives SQLite)
        conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    base, _, _ = admin.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def tables_and_columns(tx: Any) -> dict[str, list[str]]:
    """Every table of the database and its columns, read from the database's own schema."""
    if tx.dialect == "postgres":
        rows = tx.fetchall("SELECT table_name AS t, column_name AS c FROM "
                           "information_schema.columns WHERE table_schema = 'public' "
                           "ORDER BY table_name, ordinal_position", {})
        found: dict[str, list[str]] = {}
        for row in rows:
            found.setdefault(row["t"], []).append(row["c"])
        return found
    tables = [row["name"] for row in tx.fetchall(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'", {})]
    return {table: [row["name"] for row in tx.fetchall(f'PRAGMA table_info("{table}")', {})]
            for table in tables}


def holds_sql(tx: Any, column: str, k: int) -> str:
    """SQL counting the rows whose ``column`` holds subject ``:s<k>`` anywhere, or is one of
    ``:ids<k>`` (a JSON list), or such an id with a ``:``-suffix; in the store's dialect."""
    text = f'CAST("{column}" AS text)'
    if tx.dialect == "postgres":
        head = f"split_part({text}, ':', 1)"
        return (f"COALESCE(SUM(CASE WHEN strpos({text}, :s{k}) > 0 OR (length({text}) <= 200 "
                f"AND {head} IN (SELECT jsonb_array_elements_text(CAST(:ids{k} AS jsonb)))) "
                "THEN 1 ELSE 0 END), 0)")
    head = (f"(CASE WHEN instr({text}, ':') > 0 THEN substr({text}, 1, "
            f"instr({text}, ':') - 1) ELSE {text} END)")
    return (f"COALESCE(SUM(instr({text}, :s{k}) > 0 OR (length(\"{column}\") <= 200 "
            f"AND {head} IN (SELECT value FROM json_each(:ids{k})))), 0)")
