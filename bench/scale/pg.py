"""A migrated Postgres database of the benchmark's own, by URL, dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from bench.common import ADMIN_URL


@contextmanager
def scratch_url() -> Iterator[str]:
    import psycopg

    from sluice.store.db import open_database
    from sluice.store.migrate import migrate

    name = f"sluice_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    try:
        db = open_database(url)
        migrate(db)
        db.close()
        yield url
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
