"""Fixtures of the delivery integration tests: the provider stand-ins, services wired to
them, and in-process retry waits recorded instead of slept (``drain.SLEEP``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from sluice.core.services import Services
from sluice.delivery import drain
from tests.integration.delivery.helpers import WEBHOOK_SECRET, Providers
from tests.providers.slack import SlackStandIn
from tests.providers.smtp import SmtpServer
from tests.providers.telegram import TelegramStandIn
from tests.providers.webhook import WebhookReceiver

WIDE_RATES = {"SLUICE_TELEGRAM_RATE_PER_SECOND": "10000",
              "SLUICE_TELEGRAM_CHAT_RATE_PER_SECOND": "1000",
              "SLUICE_SLACK_CHANNEL_RATE_PER_SECOND": "1000",
              "SLUICE_WEBHOOK_HOST_RATE_PER_SECOND": "10000"}


@pytest.fixture(autouse=True)
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """In-process retry waits, recorded instead of slept."""
    recorded: list[float] = []
    monkeypatch.setattr(drain, "SLEEP", recorded.append)
    return recorded


@pytest.fixture
def providers() -> Iterator[Providers]:
    with (WebhookReceiver(WEBHOOK_SECRET) as webhook, SlackStandIn(archived=("C0OLD",)) as slack,
          TelegramStandIn(chats=("1001", "1002"), blocked=("1002",)) as telegram,
          SmtpServer() as smtp):
        smtp.unknown.add("gone@example.com")
        smtp.busy.add("busy@example.com")
        yield Providers(webhook, slack, telegram, smtp)


@pytest.fixture
def svc(db_url: str, providers: Providers, make_services: Callable[..., Services]) -> Services:
    # These tests are about sending and settling; the shared rates have their own tests
    # (test_ratelimit.py), so here they are wide enough never to hold a message back.
    return make_services(db_url, **providers.env(), **WIDE_RATES)
