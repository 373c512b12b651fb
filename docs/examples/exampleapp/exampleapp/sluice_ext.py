"""What the app adds to Sluice: declarations only (every Sluice function imports this at
cold start); each drain, handler factory and adapter is imported where it runs. ``PACKS``
chooses Sluice's own capabilities: this app only sends deliveries, so it runs the delivery
pack alone (no rss, alerts, metering, ledger, erasure or history functions or queues)."""

from __future__ import annotations

from typing import Any

from sluice.extend import (
    Channel,
    ChannelAdapter,
    Job,
    Outbound,
    RequestError,
    Retrier,
    Settings,
    Topic,
)

PACKS = ["delivery"]

JOBS = [
    Job(name="exampleapp-digest", route="/api/admin/exampleapp/digest",
        schedule="rate(1 minute)", surface="delivery", target="exampleapp.work:run_digest",
        failure_keys=("failed",), budget_s=20.0, timeout_s=30),
]

TOPICS = [
    # its handler enqueues under an idempotency key: completions once per batch. A message
    # is the new user and their team's pager, keyed by the user.
    Topic("exampleapp.signup", "exampleapp.work:signup_handler", batch_size=5, idempotent=True,
          fields=("userId", "name", "pager"), key=("userId",)),
]


def _build_pager(settings: Settings, outbound: Outbound, retrier: Retrier) -> ChannelAdapter | None:
    from exampleapp.pager import build

    return build(settings, outbound, retrier)


def _check_pager(value: Any, field: str) -> str:
    """A pager id: 1 to 32 lower-case letters, digits or '-'."""
    if not isinstance(value, str) or not 0 < len(value) <= 32 \
            or not all(c.isdigit() or c == "-" or "a" <= c <= "z" for c in value):
        raise RequestError(f"{field} must be a pager id (a-z, 0-9, '-', at most 32)",
                           field=field)
    return value


CHANNELS = [Channel("exampleapp-pager", "a pager id", _build_pager, check=_check_pager)]
