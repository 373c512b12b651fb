"""Secrets at cold start, read from moto's SSM and Secrets Manager over HTTP: through the
stdlib client (credentials in the environment, as on Lambda) and through botocore (a
credentials file, as on a dev box)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from sluice.core import awsjson, secrets
from sluice.core.errors import ConfigurationError
from sluice.core.secrets import SECRET_NAMES, SecretNotFound, load_secrets
from sluice.core.settings import Settings
from sluice.delivery.channels import Outbound, build_adapters
from tests.conftest import ROOT

pytestmark = pytest.mark.aws

CRON = "cron-secret-from-ssm-0123456789"
SIGNING = "new-signing-secret-0123456789,old-signing-secret-0123456789"


@pytest.fixture(autouse=True)
def fresh_clients() -> Iterator[None]:
    """Each test builds the process's clients from its own environment."""
    secrets._client.cache_clear()
    yield
    secrets._client.cache_clear()


@pytest.fixture(params=["stdlib", "botocore"])
def via(request: pytest.FixtureRequest, aws_env: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Which client reads: credentials in the environment pick the stdlib one, a credentials
    file botocore's; the test then checks that the chosen one did the reading."""
    if request.param == "botocore":
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(name)
        (tmp_path / "credentials").write_text(
            "[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    yield request.param
    assert secrets._client.cache_info().currsize >= 1  # the test read through them
    stdlib = isinstance(secrets._client("ssm"), awsjson.JsonClient)
    assert stdlib == (request.param == "stdlib")


@pytest.fixture
def stage_path(aws_env: dict[str, str]) -> str:
    """A fresh /sluice/<stage>/ path holding the stage's secrets as SecureStrings."""
    path = f"/sluice/t{uuid.uuid4().hex[:8]}/"
    ssm = boto3.client("ssm")
    for name, value in {
        "CRON_SECRET": CRON,
        "SLUICE_QUEUE_SIGNING_SECRET": SIGNING,
        "SLUICE_DATABASE_URL": "postgresql://sluice:pw@db.example.internal:5432/sluice",
        "POLAR_ACCESS_TOKEN": "polar_pat_from_ssm",
        "SENTRY_DSN": "https://key@o1.ingest.sentry.io/1",
        "NOT_A_SLUICE_SECRET": "ignored",
    }.items():
        ssm.put_parameter(Name=path + name, Value=value, Type="SecureString")
    return path


def test_path_secrets_reach_settings(stage_path: str, via: str) -> None:
    env = {"SLUICE_SECRETS_PATH": stage_path, "SLUICE_STAGE": "test"}

    loaded = load_secrets(env)

    assert loaded == sorted(["CRON_SECRET", "SLUICE_QUEUE_SIGNING_SECRET", "SLUICE_DATABASE_URL",
                             "POLAR_ACCESS_TOKEN", "SENTRY_DSN"])
    assert "NOT_A_SLUICE_SECRET" not in env
    settings = Settings.from_env(env)
    assert settings.cron_secret == CRON
    assert settings.queue_signing_secrets == ("new-signing-secret-0123456789",
                                              "old-signing-secret-0123456789")
    assert settings.database_backend == "postgres"
    assert settings.polar_access_token == "polar_pat_from_ssm"


def test_environment_wins_over_ssm(stage_path: str) -> None:
    env = {"SLUICE_SECRETS_PATH": stage_path, "CRON_SECRET": "set-directly-0123456789"}

    loaded = load_secrets(env)

    assert "CRON_SECRET" not in loaded
    assert env["CRON_SECRET"] == "set-directly-0123456789"


def test_single_parameter_and_secrets_manager(aws_env: dict[str, str], via: str) -> None:
    name = f"/elsewhere/{uuid.uuid4().hex[:8]}/polar"
    boto3.client("ssm").put_parameter(Name=name, Value="polar-from-param", Type="SecureString")
    secret_id = f"sluice/test/{uuid.uuid4().hex[:8]}/redis"
    boto3.client("secretsmanager").create_secret(Name=secret_id,
                                                 SecretString="rediss://:pw@cache.internal:6380/0")
    env = {"POLAR_ACCESS_TOKEN_PARAM": name,
           "SLUICE_REDIS_URL_PARAM": f"secretsmanager:{secret_id}"}

    assert load_secrets(env) == ["POLAR_ACCESS_TOKEN", "SLUICE_REDIS_URL"]
    assert env["POLAR_ACCESS_TOKEN"] == "polar-from-param"
    assert Settings.from_env(env).redis_url == "rediss://:pw@cache.internal:6380/0"


def test_missing_parameter_fails_naming_the_variable(aws_env: dict[str, str], via: str) -> None:
    where = f"/nowhere/{uuid.uuid4().hex}"
    env = {"CRON_SECRET_PARAM": where}

    with pytest.raises(SecretNotFound, match="CRON_SECRET_PARAM") as caught:
        load_secrets(env)

    assert (caught.value.variable, caught.value.where) == ("CRON_SECRET_PARAM", where)
    assert isinstance(caught.value, ConfigurationError)
    assert "CRON_SECRET" not in env


def test_missing_secrets_manager_secret_fails_naming_the_variable(
        aws_env: dict[str, str], via: str) -> None:
    env = {"SLUICE_SLACK_BOT_TOKEN_PARAM": f"secretsmanager:sluice/test/{uuid.uuid4().hex}"}

    with pytest.raises(SecretNotFound) as caught:
        load_secrets(env)

    assert caught.value.variable == "SLUICE_SLACK_BOT_TOKEN_PARAM"


def test_every_secret_of_the_table_under_the_path_is_read(aws_env: dict[str, str],
                                                          via: str) -> None:
    # GIVEN more secrets under the path than one GetParameters call may name (ten)
    path = f"/sluice/t{uuid.uuid4().hex[:8]}/"
    ssm = boto3.client("ssm")
    for name in SECRET_NAMES:
        ssm.put_parameter(Name=path + name, Value=f"value-of-{name}", Type="SecureString")
    env: dict[str, str] = {"SLUICE_SECRETS_PATH": path}

    # WHEN they are loaded
    loaded = load_secrets(env)

    # THEN every one of them arrives
    assert len(SECRET_NAMES) > 10
    assert loaded == sorted(SECRET_NAMES)
    assert all(env[name] == f"value-of-{name}" for name in SECRET_NAMES)


def test_a_parameter_pointed_at_by_arn_is_read(aws_env: dict[str, str],
                                               via: str) -> None:
    name = f"/elsewhere/{uuid.uuid4().hex[:8]}/cron"
    ssm = boto3.client("ssm")
    ssm.put_parameter(Name=name, Value="cron-by-arn-0123456789", Type="SecureString")
    arn = ssm.get_parameter(Name=name)["Parameter"]["ARN"]
    env = {"CRON_SECRET_PARAM": arn}

    assert load_secrets(env) == ["CRON_SECRET"]
    assert env["CRON_SECRET"] == "cron-by-arn-0123456789"


def test_unreachable_ssm_fails_naming_the_path_variable(aws_env: dict[str, str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN an SSM endpoint where nothing listens (a port just closed on loopback)
    import botocore.session

    from tests.conftest import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL_SSM", f"http://127.0.0.1:{free_port()}")
    ssm = botocore.session.get_session().create_client("ssm")

    # WHEN the stage's secrets are loaded THEN the error names the variable that configured them
    with pytest.raises(ConfigurationError, match="SLUICE_SECRETS_PATH"):
        load_secrets({"SLUICE_SECRETS_PATH": "/sluice/test/"}, ssm=ssm)


def test_unreachable_ssm_through_the_stdlib_client_fails_naming_the_path_variable(
        aws_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN credentials in the environment and an SSM endpoint where nothing listens
    from tests.conftest import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL_SSM", f"http://127.0.0.1:{free_port()}")

    # WHEN the stage's secrets are loaded
    with pytest.raises(ConfigurationError, match="SLUICE_SECRETS_PATH") as caught:
        load_secrets({"SLUICE_SECRETS_PATH": "/sluice/test/"})

    # THEN the stdlib client tried, and the connection failure is the cause
    assert isinstance(secrets._client("ssm"), awsjson.JsonClient)
    assert isinstance(caught.value.__cause__, awsjson.AwsError)
    assert caught.value.__cause__.code == "ConnectionError"


def test_a_service_error_through_the_stdlib_client_is_a_configuration_error(
        aws_env: dict[str, str]) -> None:
    # GIVEN a Secrets Manager secret marked for deletion (GetSecretValue answers 400)
    secret_id = f"sluice/test/{uuid.uuid4().hex[:8]}/deleted"
    sm = boto3.client("secretsmanager")
    sm.create_secret(Name=secret_id, SecretString="gone")
    sm.delete_secret(SecretId=secret_id)
    env = {"SENTRY_DSN_PARAM": f"secretsmanager:{secret_id}"}

    # WHEN it is loaded THEN the error names the variable and carries AWS's code
    with pytest.raises(ConfigurationError, match="SENTRY_DSN_PARAM") as caught:
        load_secrets(env)

    assert not isinstance(caught.value, SecretNotFound)
    cause = caught.value.__cause__
    assert isinstance(cause, awsjson.AwsError)
    assert (cause.code, cause.status, cause.transient) == ("InvalidRequestException", 400, False)
    assert "SENTRY_DSN" not in env


def test_nothing_configured_reads_nothing() -> None:
    env = {"CRON_SECRET": "x" * 20}

    assert load_secrets(env) == []
    assert env == {"CRON_SECRET": "x" * 20}


def _fresh(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLUICE_", "CRON_", "AWS_", "POLAR_", "SENTRY_"))}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


def test_handler_cold_start_loads_secrets_before_settings(stage_path: str,
                                                          aws_env: dict[str, str],
                                                          tmp_path: object) -> None:
    # GIVEN a scheduled function configured only with where its secrets live
    env = {**aws_env, "SLUICE_SECRETS_PATH": stage_path, "SLUICE_JOB": "state-cleanup",
           "SLUICE_STAGE": "test"}
    # (the stored database URL is Postgres on an unreachable host; point it at SQLite directly)
    env["SLUICE_DATABASE_URL"] = f"sqlite:///{tmp_path}/s.db"

    # WHEN its handler module is imported in a fresh interpreter
    done = _fresh("import functions.cron as f; print(f.SERVICES.settings.cron_secret)", env)

    # THEN the secret from SSM is in its settings
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == CRON


def test_cold_start_without_secrets_imports_no_aws_sdk() -> None:
    done = _fresh("import sys, functions; "
                  "print(any(m.startswith('aws_lambda_powertools.utilities.parameters') "
                  "or m in ('boto3', 'botocore.session') for m in sys.modules))", {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_cold_start_with_secrets_loads_them_without_any_aws_sdk(
        stage_path: str, aws_env: dict[str, str]) -> None:
    # GIVEN a function whose secrets live under the stage's path in SSM, and credentials in
    # its environment, as Lambda gives them
    env = {**aws_env, "SLUICE_SECRETS_PATH": stage_path}

    # WHEN the functions package loads them in a fresh interpreter
    done = _fresh("import os, sys, functions; "
                  "print(os.environ['CRON_SECRET'], "
                  "sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore', "
                  "'s3transfer', 'urllib3') or m.startswith("
                  "'aws_lambda_powertools.utilities.parameters')))", env)

    # THEN they arrive with no SDK imported at all
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{CRON} []"


def test_delivery_credentials_come_from_the_stage_path(aws_env: dict[str, str]) -> None:
    # GIVEN every secret field of the settings table stored under the stage's path
    path = f"/sluice/t{uuid.uuid4().hex[:8]}/"
    ssm = boto3.client("ssm")
    stored = {
        "SLUICE_SLACK_BOT_TOKEN": "xoxb-from-ssm",
        "SLUICE_TELEGRAM_BOT_TOKEN": "123:from-ssm",
        "SLUICE_WEBHOOK_SIGNING_SECRET": "webhook-secret-from-ssm-0123",
        "SLUICE_SMTP_PASSWORD": "smtp-password-from-ssm",
    }
    for name, value in stored.items():
        ssm.put_parameter(Name=path + name, Value=value, Type="SecureString")
    env = {"SLUICE_SECRETS_PATH": path, "SLUICE_SMTP_HOST": "127.0.0.1",
           "SLUICE_SMTP_FROM": "a@sluice.test", "SLUICE_SMTP_USERNAME": "alerts"}

    # WHEN they are loaded at cold start
    loaded = load_secrets(env)

    # THEN each reaches its setting, and every channel has its adapter
    assert loaded == sorted(stored)
    settings = Settings.from_env(env)
    assert (settings.slack_bot_token, settings.telegram_bot_token, settings.smtp_password,
            settings.webhook_signing_secrets) == tuple(stored[k] for k in (
                "SLUICE_SLACK_BOT_TOKEN", "SLUICE_TELEGRAM_BOT_TOKEN", "SLUICE_SMTP_PASSWORD",
            )) + ((stored["SLUICE_WEBHOOK_SIGNING_SECRET"],),)
    with Outbound.open(settings) as client:
        assert sorted(build_adapters(settings, client)) == ["email", "slack", "telegram",
                                                             "webhook"]


def test_a_delivery_token_can_live_in_secrets_manager(aws_env: dict[str, str]) -> None:
    secret_id = f"sluice/test/{uuid.uuid4().hex[:8]}/telegram"
    boto3.client("secretsmanager").create_secret(Name=secret_id, SecretString="456:from-sm")
    env = {"SLUICE_TELEGRAM_BOT_TOKEN_PARAM": f"secretsmanager:{secret_id}"}
    assert load_secrets(env) == ["SLUICE_TELEGRAM_BOT_TOKEN"]
    assert Settings.from_env(env).telegram_bot_token == "456:from-sm"
