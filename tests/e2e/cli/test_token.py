"""``sluice token`` mints a local admin JWT; ``sluice dev`` says what is configured."""

from __future__ import annotations

import jwt
import pytest

from sluice.cli.dev import startup_summary
from sluice.core.auth import AdminVerifier
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.ops.access import NoLocalSecret, mint_token, parse_ttl
from tests.conftest import JWT_SECRET, run_cli


def test_token_is_accepted_on_the_roles_it_names(sqlite_url: str) -> None:
    result = run_cli(["token", "--roles", "ops,billing", "--ttl", "30m"],
                     {"SLUICE_ADMIN_JWT_SECRET": JWT_SECRET, "SLUICE_DATABASE_URL": sqlite_url})
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    identity = AdminVerifier(Settings(admin_jwt_secret=JWT_SECRET)).authorize(token, "queues")
    assert identity.roles == {"ops", "billing"}
    claims = jwt.decode(token, JWT_SECRET, algorithms=["HS256"])
    assert claims["exp"] - claims["iat"] == 1800


def test_token_is_refused_without_a_secret_with_the_fix(sqlite_url: str) -> None:
    result = run_cli(["token", "--roles", "ops"], {"SLUICE_DATABASE_URL": sqlite_url})
    assert result.returncode == 78 and result.stdout == ""
    assert "no_admin_secret" in result.stderr and "SLUICE_ADMIN_JWT_SECRET" in result.stderr
    with pytest.raises(NoLocalSecret):
        mint_token(Settings(), ["ops"])


def test_unknown_roles_and_bad_ttls_are_refused(sqlite_url: str) -> None:
    result = run_cli(["token", "--roles", "ops,root"],
                     {"SLUICE_ADMIN_JWT_SECRET": JWT_SECRET, "SLUICE_DATABASE_URL": sqlite_url})
    assert result.returncode == 64 and "root" in result.stderr
    assert parse_ttl("12h").total_seconds() == 43200
    for bad in ("0", "-5m", "31d", "soon"):
        with pytest.raises(Exception, match="ttl"):
            parse_ttl(bad)


def test_dev_summary_names_what_is_configured(sqlite_url: str, make_services: object) -> None:
    services: Services = make_services(  # type: ignore[operator]
        sqlite_url, SLUICE_REDIS_URL="redis://user:hunter2@127.0.0.1:6379/0",
        SLUICE_SLACK_BOT_TOKEN="xoxb-test")
    text = startup_summary(services, "http://127.0.0.1:8787")
    assert "database     sqlite" in text
    assert "hunter2" not in text and "redis://user:***@127.0.0.1:6379/0" in text
    assert "queues       local mode" in text and "cron secret  set" in text
    assert "admin auth   HS256 secret" in text and "channels     slack" in text
    assert "http://127.0.0.1:8787/admin/login?nonce=" in text
    bare: Services = make_services(sqlite_url, SLUICE_ADMIN_JWT_SECRET="", CRON_SECRET="")  # type: ignore[operator]
    text = startup_summary(bare, "http://127.0.0.1:8787")
    assert "cron secret  not set" in text and "admin auth   not configured" in text
    assert "nonce=" not in text and "sluice token" in text
