"""Versioned migrations from ``shared/sluice/store/migrations``.

Each version is ``NNNN_name.<dialect>.sql``; both dialects must exist so the
SQLite and Postgres schemas never drift. A version is applied in one
transaction together with its row in ``schema_migrations``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from sluice.core.errors import ConfigurationError, PermanentStoreError
from sluice.store.db import MIGRATIONS_DIR, PostgresDatabase, SqliteDatabase

_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[\w-]+)\.(?P<dialect>sqlite|postgres)\.sql$")

_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version text PRIMARY KEY,
    name text NOT NULL,
    applied_at text NOT NULL
);
"""


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    path: Path


def migrations_dir() -> Path:
    return Path(os.environ.get("SLUICE_MIGRATIONS_DIR") or MIGRATIONS_DIR)


def discover(dialect: str, directory: Path | None = None) -> list[Migration]:
    directory = directory or migrations_dir()
    if not directory.is_dir():
        raise ConfigurationError(f"migrations directory not found: {directory}")
    by_version: dict[str, dict[str, Path]] = {}
    for path in directory.iterdir():
        match = _FILE.match(path.name)
        if match:
            by_version.setdefault(match["version"] + "_" + match["name"], {})[match["dialect"]] = path
    found = []
    for key in sorted(by_version):
        variants = by_version[key]
        if set(variants) != {"sqlite", "postgres"}:
            raise ConfigurationError(f"migration {key} must exist for both sqlite and postgres")
        version, name = key.split("_", 1)
        found.append(Migration(version, name, variants[dialect]))
    return found


def _record(migration: Migration, dialect: str) -> str:
    return ("INSERT INTO schema_migrations (version, name, applied_at) "
            f"VALUES ('{migration.version}', '{migration.name}', "
            + ("CURRENT_TIMESTAMP" if dialect == "sqlite" else "now()::text")
            + ") ON CONFLICT (version) DO NOTHING;")


def applied(db: SqliteDatabase | PostgresDatabase) -> set[str]:
    db.run_script(_BOOKKEEPING)
    with db.transaction() as tx:
        return {row["version"] for row in tx.fetchall("SELECT version FROM schema_migrations")}


def pending(db: SqliteDatabase | PostgresDatabase) -> list[Migration]:
    done = applied(db)
    return [m for m in discover(db.dialect) if m.version not in done]


def unapplied(path: Path) -> list[Migration]:
    """``pending`` for the SQLite file at ``path``, read through a read-only connection (no
    WAL switch, no bookkeeping table): what it still lacks, every migration when it has
    no ``schema_migrations`` table at all."""
    import sqlite3

    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        known = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                             "AND name = 'schema_migrations'").fetchone()
        done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")
                } if known else set()
    except sqlite3.Error as exc:
        raise ConfigurationError(f"SLUICE_DATABASE_URL: {path} is not an SQLite database "
                                 f"Sluice can read ({exc})") from exc
    finally:
        conn.close()
    return [m for m in discover("sqlite") if m.version not in done]


def migrate(db: SqliteDatabase | PostgresDatabase) -> list[Migration]:
    """Apply every pending migration in order; return what was applied.

    On Postgres the advisory lock is taken first and held until the end, and what is
    pending is read under it: a second migrator waits, then finds nothing to do. On
    SQLite each version is applied in its own ``BEGIN IMMEDIATE`` transaction.
    """
    if isinstance(db, PostgresDatabase):
        return _migrate_postgres(db)
    done = []
    for migration in pending(db):
        body = migration.path.read_text()
        script = f"BEGIN IMMEDIATE;\n{body}\n{_record(migration, 'sqlite')}\nCOMMIT;"
        try:
            db.run_script(script)
        except PermanentStoreError as exc:
            raise PermanentStoreError(f"migration {migration.path.name} failed: {exc}") from exc
        done.append(migration)
    return done


def _migrate_postgres(db: PostgresDatabase) -> list[Migration]:
    done = []
    with db.migration_session() as run:
        run(_BOOKKEEPING)
        versions = {row["version"] for row in run("SELECT version FROM schema_migrations")}
        for migration in discover(db.dialect):
            if migration.version in versions:
                continue
            try:
                run(f"{migration.path.read_text()}\n{_record(migration, 'postgres')}")
            except PermanentStoreError as exc:
                raise PermanentStoreError(
                    f"migration {migration.path.name} failed: {exc}") from exc
            done.append(migration)
    return done
