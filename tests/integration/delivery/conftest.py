"""Fixtures of the delivery integration tests: the provider stand-ins, services wired to
them, and in-process retry waits recorded instead of slept (``drain.SLEEP``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from shared.core.services import Services
from shared.delivery import drain
from tests.integration.delivery.helpers import WEBHOOK_SECRET, Providers
from tests.providers.slack import SlackStandIn
from tests.providers.smtp import SmtpServer
from tests.providers.telegram import TelegramStandIn
from tests.providers.webhook import WebhookReceiver


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
    return make_services(db_url, **providers.env())
