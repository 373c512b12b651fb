"""Shared fixtures: real Postgres, real Redis, moto in server mode, per-run isolation.

Every test run gets its own Postgres databases (a migrated template cloned per
test) and its own Redis key prefix, so runs never see each other's data. A
missing service fails the run loudly; nothing is skipped.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jwt
import psycopg
import pytest

from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.store.db import PostgresDatabase, SqliteDatabase, open_database
from sluice.store.migrate import migrate

ROOT = Path(__file__).resolve().parent.parent
EVENTS = Path(__file__).parent / "events"
PG_ADMIN_URL = os.environ.get("SLUICE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("SLUICE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
RUN_ID = uuid.uuid4().hex[:10]
CRON_SECRET = "cron-secret-for-tests-0123456789"
JWT_SECRET = "admin-jwt-secret-for-tests-0123456789abcdef"
_counter = itertools.count()


def load_event(name: str) -> dict[str, Any]:
    """A Lambda event sample from tests/events/<name>.json."""
    data: dict[str, Any] = json.loads((EVENTS / f"{name}.json").read_text())
    return data


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def admin_token(roles: list[str], *, subject: str = "admin-1", secret: str = JWT_SECRET,
                expires_in: int = 300, **claims: Any) -> str:
    now = int(time.time())
    payload = {"sub": subject, "roles": roles, "iat": now, "exp": now + expires_in, **claims}
    return jwt.encode(payload, secret, algorithm="HS256")


# --- Postgres -----------------------------------------------------------------


def _pg_admin() -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:  # loud: a missing service fails the run
        raise RuntimeError(f"Postgres is not answering at {PG_ADMIN_URL}: {exc}. "
                           "Start it (tests/run does).") from exc


def _pg_url(name: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    name = f"sluice_tpl_{RUN_ID}"
    with _pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    db = PostgresDatabase(_pg_url(name))
    migrate(db)
    db.close()
    yield name
    with _pg_admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    """A fresh, migrated Postgres database for one test."""
    name = f"sluice_t_{RUN_ID}_{next(_counter)}"
    with _pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield _pg_url(name)
    with _pg_admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/sluice.db"
    migrate(open_database(url))
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each store contract test runs on both backends."""
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture
def db(db_url: str) -> Iterator[SqliteDatabase | PostgresDatabase]:
    database = open_database(db_url)
    yield database
    database.close()


# --- Redis --------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server() -> str:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        raise RuntimeError(f"Redis is not answering at {REDIS_URL}: {exc}. "
                           "Start it (tests/run does).") from exc
    return REDIS_URL


@pytest.fixture
def redis_prefix(redis_server: str) -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards."""
    import redis

    prefix = f"sluice-test:{RUN_ID}:{next(_counter)}:"
    yield prefix
    client = redis.Redis.from_url(redis_server)
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


# --- Settings and services ----------------------------------------------------


BASE_ENV = {
    "CRON_SECRET": CRON_SECRET,
    "SLUICE_ADMIN_JWT_SECRET": JWT_SECRET,
    "SLUICE_STAGE": "test",
    # webhook receivers in tests are local servers (a test of the guard clears this)
    "SLUICE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
}


@pytest.fixture
def make_services() -> Iterator[Callable[..., Services]]:
    """Build ``Services`` from an environment mapping (BASE_ENV plus overrides)."""
    made: list[Services] = []

    def make(database_url: str, **env: str) -> Services:
        settings = Settings.from_env({**BASE_ENV, "SLUICE_DATABASE_URL": database_url, **env})
        services = Services(settings, open_database(settings.database_url), Reporter())
        made.append(services)
        return services

    yield make
    for services in made:
        services.close()


@pytest.fixture
def services(db_url: str, make_services: Callable[..., Services]) -> Services:
    return make_services(db_url)


# --- Subprocesses -------------------------------------------------------------


def process_env(env: dict[str, str]) -> dict[str, str]:
    """A child process's environment: this one's without Sluice's settings, then ``env``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "CRON_"))}
    full_env.update(env)
    return full_env


def run_cli(args: list[str], env: dict[str, str], *, timeout: float = 120,
            stdin: str | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``sluice`` in a fresh interpreter (so crash points can kill it for real)."""
    return subprocess.run([sys.executable, "-m", "sluice.cli.main", *args],
                          env=process_env(env), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, input=stdin,
                          check=False)


def start_dev(env: dict[str, str], cwd: Path, *args: str) -> tuple[str, subprocess.Popen[str]]:
    """``sluice dev`` in a fresh interpreter (``env`` over the process's, without its
    ``SLUICE_*``), on a port of its own, once ``/api/health`` answers: its base URL and the
    process (the caller terminates it)."""
    port = free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "CRON_"))}
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli.main", "dev", "--port",
                             str(port), *args], cwd=cwd, env={**full, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(600):
        try:
            if httpx.get(f"{base}/api/health", timeout=1).status_code == 200:
                return base, proc
        except httpx.TransportError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"sluice dev did not start: {proc.communicate()[0]}")


# --- AWS (moto in server mode, over real HTTP) ----------------------------------


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def aws_env(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """boto3 pointed at moto over HTTP with dummy credentials."""
    env = {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "eu-north-1",
        "AWS_REGION": "eu-north-1", "AWS_ENDPOINT_URL": moto_endpoint,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env
