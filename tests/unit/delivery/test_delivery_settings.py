"""Delivery settings fail early and name the variable; adapters exist when configured;
the webhook signature a receiver checks."""

from __future__ import annotations

import pytest

from sluice.core.errors import ConfigurationError
from sluice.core.settings import Settings
from sluice.delivery.channels import Outbound, build_adapters, channels

SECRET = "webhook-secret-0123456789"


def test_defaults_configure_no_adapter() -> None:
    settings = Settings.from_env({})
    assert (settings.delivery_lease_s, settings.delivery_retention_days,
            settings.delivery_send_timeout_s) == (120, 7, 10.0)
    with Outbound.open(settings) as client:
        assert build_adapters(settings, client) == {}


def test_each_credential_adds_its_adapter() -> None:
    settings = Settings.from_env({
        "SLUICE_WEBHOOK_SIGNING_SECRET": SECRET, "SLUICE_SLACK_BOT_TOKEN": "xoxb-1",
        "SLUICE_TELEGRAM_BOT_TOKEN": "1:abc", "SLUICE_SMTP_HOST": "mail.local",
        "SLUICE_SMTP_FROM": "a@b.c", "SLUICE_SLACK_API_URL": "http://127.0.0.1:9/api/"})
    assert settings.slack_api_url == "http://127.0.0.1:9/api"
    with Outbound.open(settings) as client:
        assert sorted(build_adapters(settings, client)) == ["email", "slack", "telegram",
                                                             "webhook"]


@pytest.mark.parametrize(("env", "named"), [
    ({"SLUICE_WEBHOOK_SIGNING_SECRET": "short"}, "SLUICE_WEBHOOK_SIGNING_SECRET"),
    ({"SLUICE_WEBHOOK_SIGNING_SECRET": "whsec_not*base64"}, "SLUICE_WEBHOOK_SIGNING_SECRET"),
    ({"SLUICE_WEBHOOK_SIGNING_SECRET": "whsec_" + "QUJD"}, "entry 1: a whsec_ secret must decode"),
    ({"SLUICE_WEBHOOK_SIGNING_SECRET": SECRET + ",short"}, "entry 2"),
    ({"SLUICE_SMTP_SECURITY": "tls"}, "SLUICE_SMTP_SECURITY"),
    ({"SLUICE_SMTP_HOST": "mail.local"}, "SLUICE_SMTP_FROM"),
    ({"SLUICE_SMTP_USERNAME": "u"}, "SLUICE_SMTP_PASSWORD"),
    ({"SLUICE_SMTP_PORT": "0"}, "SLUICE_SMTP_PORT"),
    ({"SLUICE_DELIVERY_LEASE_SECONDS": "soon"}, "SLUICE_DELIVERY_LEASE_SECONDS"),
    ({"SLUICE_TELEGRAM_API_URL": "ftp://x"}, "SLUICE_TELEGRAM_API_URL"),
])
def test_bad_values_fail_at_start_up_naming_the_variable(env: dict[str, str],
                                                         named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        Settings.from_env(env)


def test_the_registry_lists_one_module_per_channel() -> None:
    import importlib

    # the delivery pack registers one adapter module of sluice.delivery.channels per channel
    assert list(channels()) == ["webhook", "slack", "telegram", "email"]
    assert all(channel.recipient for channel in channels().values())
    assert all(callable(importlib.import_module(f"sluice.delivery.channels.{name}").build)
               for name in channels())


@pytest.mark.parametrize(("raw", "seconds"), [
    (None, 5 * 86400), ("5d", 5 * 86400), ("36h", 36 * 3600), ("90m", 5400),
    ("3600s", 3600), ("365d", 365 * 86400), (" 2d ", 2 * 86400)])
def test_the_disable_after_duration_reads_a_number_and_a_unit(raw: str | None,
                                                                seconds: int) -> None:
    env = {} if raw is None else {"SLUICE_DESTINATION_DISABLE_AFTER": raw}
    assert Settings.from_env(env).destination_disable_after_s == seconds


@pytest.mark.parametrize("raw", [
    "5", "5 d", "5days", "5D", "d", "1.5d", "-1d", "+1d", "1e3s", "٥d", "0x10s",
    "59m", "366d", "9999999999d", "nan", "inf"])
def test_the_disable_after_duration_is_parsed_strictly_and_bounded(raw: str) -> None:
    with pytest.raises(ConfigurationError, match="SLUICE_DESTINATION_DISABLE_AFTER"):
        Settings.from_env({"SLUICE_DESTINATION_DISABLE_AFTER": raw})
