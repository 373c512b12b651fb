from __future__ import annotations

import pytest

from shared.core.errors import ConfigurationError
from shared.core.settings import DEFAULT_DATABASE_URL, Settings


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
