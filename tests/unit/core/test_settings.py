from __future__ import annotations

from pathlib import Path

import pytest

from sluice.core.errors import ConfigurationError
from sluice.core.secrets import SECRET_NAMES
from sluice.core.settings import DEFAULT_DATABASE_URL, Settings, fields, secret_variables


def test_defaults_are_the_embedded_runtime() -> None:
    settings = Settings.from_env({})
    assert settings.database_url == DEFAULT_DATABASE_URL
    assert settings.database_backend == "sqlite"
    assert settings.cron_secret is None
    assert settings.redis_configured is False
    assert settings.queue_prefix == "sluice-dev-"


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"CRON_SECRET": "short"}, "CRON_SECRET"),
        ({"CRON_SECRET": "ünïcödé-secret-123456"}, "CRON_SECRET"),
        ({"SLUICE_DATABASE_URL": "mysql://x/y"}, "SLUICE_DATABASE_URL"),
        ({"SLUICE_REDIS_URL": "http://127.0.0.1"}, "SLUICE_REDIS_URL"),
        ({"UPSTASH_REDIS_REST_URL": "https://x.upstash.io"}, "UPSTASH_REDIS_REST_TOKEN"),
        ({"SLUICE_ADMIN_JWT_SECRET": "too-short"}, "SLUICE_ADMIN_JWT_SECRET"),
        ({"SLUICE_ADMIN_JWKS_URL": "ftp://idp/jwks"}, "SLUICE_ADMIN_JWKS_URL"),
        ({"SENTRY_DSN": "not a url"}, "SENTRY_DSN"),
        ({"SLUICE_DEADLINE_MARGIN_SECONDS": "soon"}, "SLUICE_DEADLINE_MARGIN_SECONDS"),
        ({"SLUICE_METERING_EVENTS_PER_REQUEST": "101"}, "SLUICE_METERING_EVENTS_PER_REQUEST"),
        ({"SLUICE_QUEUE_MODE": "kafka"}, "SLUICE_QUEUE_MODE"),
    ],
)
def test_a_bad_value_names_its_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env(env)
    assert names in str(info.value)


def test_empty_cron_secret_means_unset() -> None:
    assert Settings.from_env({"CRON_SECRET": "   "}).cron_secret is None


def test_postgres_url_selects_postgres() -> None:
    settings = Settings.from_env({"SLUICE_DATABASE_URL": "postgresql://postgres@127.0.0.1/x"})
    assert settings.database_backend == "postgres"


def test_signing_secrets_are_a_comma_list() -> None:
    settings = Settings.from_env(
        {"SLUICE_QUEUE_SIGNING_SECRET": "first-secret-0123456, second-secret-012345"})
    assert settings.queue_signing_secrets == ("first-secret-0123456", "second-secret-012345")


def test_every_field_is_read_from_one_variable_of_its_own() -> None:
    table = fields()
    assert list(table) == list(Settings._fields)
    names = [var.name for var in table.values()]
    assert len(names) == len(set(names))


def test_secret_fields_are_exactly_the_loadable_secrets() -> None:
    secrets = secret_variables()
    assert {"SLUICE_SLACK_BOT_TOKEN", "SLUICE_TELEGRAM_BOT_TOKEN", "SLUICE_SMTP_PASSWORD",
            "SLUICE_WEBHOOK_SIGNING_SECRET", "CRON_SECRET", "POLAR_ACCESS_TOKEN"} <= set(secrets)
    assert secrets == tuple(v.name for v in fields().values() if v.secret)
    assert "SLUICE_SMTP_HOST" not in secrets and "SLUICE_STAGE" not in secrets
    assert SECRET_NAMES == secrets, "the cold-start loader reads the table, no list of its own"


def test_the_queue_prefix_follows_the_stage_unless_set() -> None:
    assert Settings.from_env({"SLUICE_STAGE": "prod"}).queue_prefix == "sluice-prod-"
    assert Settings.from_env({"SLUICE_QUEUE_PREFIX": "x-"}).queue_prefix == "x-"


def test_delivery_expiry_and_outage_threshold() -> None:
    settings = Settings.from_env({})
    assert (settings.delivery_expire_s, settings.delivery_outage_threshold) == (86400, 3)
    with pytest.raises(ConfigurationError, match="SLUICE_DELIVERY_EXPIRE_SECONDS must be "
                                                 "between 60 and 2592000, got 5"):
        Settings.from_env({"SLUICE_DELIVERY_EXPIRE_SECONDS": "5"})


def test_messages_keep_their_wording() -> None:
    cases = {
        "SLUICE_METERING_EVENTS_PER_REQUEST": ("x", "must be a whole number, got 'x'"),
        "SLUICE_DEADLINE_MARGIN_SECONDS": ("99", "must be between 0.0 and 60.0, got 99.0"),
        "SLUICE_QUEUE_MODE": ("kafka", "must be 'local' or 'sqs', got 'kafka'"),
        "CRON_SECRET": ("short", "must be at least 16 characters"),
        "SLUICE_QUEUE_SIGNING_SECRET": ("ok-length-secret-1,short",
                                        "each SLUICE_QUEUE_SIGNING_SECRET entry must be at least"),
    }
    for name, (value, message) in cases.items():
        with pytest.raises(ConfigurationError, match=message):
            Settings.from_env({name: value})


def test_every_variable_is_documented_under_configuration() -> None:
    section = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    missing = [var.name for var in fields().values() if f"`{var.name}`" not in section]
    assert missing == []
