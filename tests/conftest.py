"""Shared fixtures: real Postgres, real Redis, moto in server mode, per-run isolation.

Every test run gets its own Postgres databases (a migrated template cloned, then
handed from test to test emptied: see ``pg_url``) and its own Redis key prefix, so runs
never see each other's data. A missing service fails the run loudly; nothing is skipped.
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
        for made in sorted(_made):
            conn.execute(f'DROP DATABASE IF EXISTS "{made}" WITH (FORCE)')
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# What a database's schema is (its relations, columns, constraints, triggers, functions,
# schemas and migrations): a test database is given to the next test only while this is
# still the template's.
_SCHEMA = """
SELECT md5(concat_ws('|',
  (SELECT string_agg(n.nspname || '.' || c.relname || ':' || c.relkind::text, ',' ORDER BY 1)
   FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')),
  (SELECT string_agg(table_schema || '.' || table_name || '.' || column_name || ':'
                     || data_type || ':' || is_nullable || ':' || coalesce(column_default, ''),
                     ',' ORDER BY 1)
   FROM information_schema.columns
   WHERE table_schema NOT IN ('pg_catalog', 'information_schema')),
  (SELECT string_agg(conname || ':' || pg_get_constraintdef(oid), ',' ORDER BY 1)
   FROM pg_constraint WHERE connamespace NOT IN ('pg_catalog'::regnamespace,
                                                 'information_schema'::regnamespace)),
  (SELECT string_agg(tgname, ',' ORDER BY 1) FROM pg_trigger WHERE NOT tgisinternal),
  (SELECT string_agg(proname, ',' ORDER BY 1) FROM pg_proc
   WHERE pronamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)),
  (SELECT string_agg(nspname, ',' ORDER BY 1) FROM pg_namespace),
  (SELECT string_agg(version::text, ',' ORDER BY 1) FROM schema_migrations))) AS schema
"""
_pool: list[str] = []  # this worker's databases, emptied, for the next test
_made: set[str] = set()  # this worker's databases that exist now


def _schema(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute(_SCHEMA).fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture(scope="session")
def pg_template_schema(pg_template: str) -> str:
    with psycopg.connect(_pg_url(pg_template), autocommit=True) as conn:
        return _schema(conn)


def _emptied(name: str, schema: str) -> bool:
    """``name`` as the template left it again, in place: whatever the test left connected
    is cut off, every table emptied and its statistics forgotten; False, and nothing
    reused, when its schema is not the template's any more (a test that dropped, added or
    altered something)."""
    with _pg_admin() as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
    try:
        with psycopg.connect(_pg_url(name), autocommit=True, connect_timeout=5) as conn:
            if _schema(conn) != schema:
                return False
            tables = [row[0] for row in conn.execute(
                "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables "
                "WHERE schemaname = 'public' AND tablename <> 'schema_migrations'")]
            with conn.transaction():
                # TRUNCATE, not DELETE: a table starts again from no page at all, and the
                # planner's statistics go too, so a plan the next test reads is the plan of
                # a fresh clone's never-analysed tables. Only the tables with a page (a
                # test writes to a few) cost a truncation.
                written = [row[0] for row in conn.execute(
                    "SELECT t FROM unnest(%s::text[]) AS t "
                    "WHERE pg_relation_size(t::regclass) > 0", (tables,))]
                if written:
                    conn.execute(f"TRUNCATE {', '.join(written)} CASCADE")
                conn.execute("DELETE FROM pg_statistic WHERE starelid = ANY (%s::regclass[])",
                             (tables,))
    except psycopg.Error:
        return False
    return True


@pytest.fixture
def pg_url(pg_template: str, pg_template_schema: str) -> Iterator[str]:
    """A migrated Postgres database of its own for one test: cloned from the template, or
    one an earlier test of this worker used, emptied and with the template's schema (a
    clone and its drop cost 0.5 s, emptying one about 30 ms, and about 900 tests take one)."""
    if _pool:
        name = _pool.pop()
    else:
        name = f"sluice_t_{RUN_ID}_{next(_counter)}"
        with _pg_admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
        _made.add(name)
    yield _pg_url(name)
    if _emptied(name, pg_template_schema):
        _pool.append(name)
    else:
        _made.discard(name)
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


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The whole suite on both cores (``-n 2``), tests/deploy on one of them: each
    deployment is packaged once a run, not once per worker (two packagings at once also
    slowed each other on two cores). ``--dist loadgroup`` cannot say so with pytest 9:
    xdist 3.8 groups a test by renaming its node id, which pytest 9 no longer lets a
    plugin do, so the group was spread over both workers. Every other test is a unit of its
    own, as with ``--dist load``."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class DeployOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "tests/deploy" if nodeid.startswith("tests/deploy/") else nodeid

    return DeployOnOneWorker(config, log)
