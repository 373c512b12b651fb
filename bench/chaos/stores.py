"""Scratch stores for one chaos run: a fresh database per run, a Redis key prefix per run."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from bench.common import ADMIN_URL

BACKENDS = ("sqlite", "postgres")
REDIS_URL_ENV = "SLUICE_TEST_REDIS_URL"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _pg_url(name: str) -> str:
    return ADMIN_URL.rsplit("/", 1)[0] + "/" + name


class ScratchStores:
    """Migrates one template per backend, then hands out a fresh copy per run."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:8]
        self._dir = Path(tempfile.mkdtemp(prefix="sluice-chaos-"))
        self._sqlite_template: Path | None = None
        self._pg_template: str | None = None
        self._pg_made: list[str] = []
        self._count = 0

    def _admin(self) -> Any:
        import psycopg

        return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)

    def fresh(self, backend: str) -> str:
        """A migrated, empty database of its own; its URL."""
        from sluice.store.db import open_database
        from sluice.store.migrate import migrate

        self._count += 1
        if backend == "sqlite":
            if self._sqlite_template is None:
                self._sqlite_template = self._dir / "template.db"
                db = open_database(f"sqlite:///{self._sqlite_template}")
                migrate(db)
                db.close()
            path = self._dir / f"run{self._count}.db"
            shutil.copyfile(self._sqlite_template, path)
            return f"sqlite:///{path}"
        if backend != "postgres":
            raise ValueError(f"unknown backend {backend!r}")
        if self._pg_template is None:
            self._pg_template = f"sluice_chaos_tpl_{self.tag}"
            with self._admin() as admin:
                admin.execute(f'CREATE DATABASE "{self._pg_template}"')
            db = open_database(_pg_url(self._pg_template))
            migrate(db)
            db.close()
        name = f"sluice_chaos_{self.tag}_{self._count}"
        with self._admin() as admin:
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self._pg_template}"')
        self._pg_made.append(name)
        return _pg_url(name)

    def drop(self, url: str) -> None:
        if url.startswith("sqlite:///"):
            path = Path(url.removeprefix("sqlite:///"))
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            return
        name = url.rsplit("/", 1)[1]
        with self._admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self._pg_made:
            self._pg_made.remove(name)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        names = list(self._pg_made) + ([self._pg_template] if self._pg_template else [])
        if names:
            with self._admin() as admin:
                for name in names:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(self._dir, ignore_errors=True)


@contextmanager
def redis_prefix(url: str) -> Iterator[str]:
    """A key prefix of the run's own on the Redis at ``url``; its keys deleted afterwards."""
    import redis

    prefix = f"sluice-chaos:{uuid.uuid4().hex[:10]}:"
    try:
        yield prefix
    finally:
        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
