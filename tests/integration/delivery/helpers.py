"""Helpers of the delivery integration tests: the four provider stand-ins and their
environment, the seed's counts of a result, one drain run, time travel."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from datetime import timedelta

from sluice.core.errors import TransientStoreError
from sluice.core.services import Services
from sluice.jobs.registry import get_job
from sluice.jobs.runner import run_job
from sluice.store.db import utcnow
from tests.providers.slack import SlackStandIn
from tests.providers.smtp import SmtpServer
from tests.providers.telegram import TelegramStandIn
from tests.providers.webhook import WebhookReceiver

WEBHOOK_SECRET = "webhook-secret-for-tests-0123456789"


@dataclass
class Providers:
    webhook: WebhookReceiver
    slack: SlackStandIn
    telegram: TelegramStandIn
    smtp: SmtpServer

    def env(self) -> dict[str, str]:
        return {
            "SLUICE_WEBHOOK_SIGNING_SECRET": WEBHOOK_SECRET,
            "SLUICE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
            "SLUICE_SLACK_BOT_TOKEN": self.slack.token, "SLUICE_SLACK_API_URL": self.slack.url,
            "SLUICE_TELEGRAM_BOT_TOKEN": self.telegram.token,
            "SLUICE_TELEGRAM_API_URL": self.telegram.url,
            "SLUICE_SMTP_HOST": "127.0.0.1", "SLUICE_SMTP_PORT": str(self.smtp.port),
            "SLUICE_SMTP_SECURITY": "none", "SLUICE_SMTP_FROM": "alerts@sluice.test",
            "SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS": "5",
        }


SEED_KEYS = ("recovered", "failed", "skippedMaxRetries", "deferredBackoff")


def seed(result: dict[str, object]) -> dict[str, object]:
    """The seed's four counts of a drain result."""
    return {key: result[key] for key in SEED_KEYS}


def drain_once(services: Services) -> dict[str, int]:
    outcome = run_job(get_job("delivery-drain"), services, "cli")
    assert outcome.status == 200, outcome.body
    return outcome.body


def drain_settled(services: Services, within_s: float = 10.0) -> dict[str, int]:
    """Drain until nothing waits (real time: a destination's spacing, such as Telegram's
    one message a second to a chat, holds an entry a moment past a drain, and the next
    drain counts it waiting), at most ``within_s``; the last run's result. For tests whose
    sends all succeed: a send that failed would wait its backoff, and this gives up then."""
    deadline = time.monotonic() + within_s
    while True:
        result = drain_once(services)
        waiting = result["rateLimited"] + result["deferredBackoff"]
        if not waiting or time.monotonic() >= deadline:
            return result
        time.sleep(0.25)


def due_now(services: Services) -> None:
    """Time travel: every pending entry's backoff, every failing receiver's wait for its
    next probe, and every receiver's wait for a rate slot or its provider, has passed."""
    with services.db.transaction() as tx:
        tx.execute("UPDATE delivery_queue SET next_attempt_at = :now WHERE status = 'pending'",
                   {"now": utcnow() - timedelta(seconds=1)})
        tx.execute("UPDATE delivery_destinations SET next_probe_at = :now, ready_at = NULL",
                   {"now": utcnow() - timedelta(seconds=1)})
        # the rates' own clock (the slots already taken) travels too: a slot counted in
        # real time would hold a request the travelled clock says may go
        tx.execute("DELETE FROM delivery_rate_limits")
    if services.settings.redis_configured:
        with contextlib.suppress(TransientStoreError):  # a Redis that is down holds no slot
            services.redis.eval("for _, k in ipairs(redis.call('KEYS', ARGV[1])) do "
                                "redis.call('DEL', k) end return 0", [],
                                [services.redis.key("delivery:rate:") + "*"])
