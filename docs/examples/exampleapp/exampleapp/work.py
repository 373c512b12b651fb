"""The app's job and topic handler."""

from __future__ import annotations

from typing import Any

from sluice.extend import Handler, InboundMessage, JobContext, Result, Services

PAGER = "exampleapp-pager"


def signup_handler(services: Services) -> Handler:
    """``exampleapp.signup``: page the new user's team with a welcome (once per user)."""
    from shared.text import welcome  # the app's own `shared`, not Sluice's

    import sluice

    def handle(message: dict[str, Any], inbound: InboundMessage) -> None:
        sluice.enqueue_delivery(services, PAGER, str(message["pager"]),
                                {"text": welcome(str(message["name"]))},
                                idempotency_key=f"signup:{message['userId']}")

    return handle


def run_digest(ctx: JobContext) -> Result:
    """``exampleapp-digest``: one digest page a run, keyed by its minute (a rerun of the same
    minute stores nothing twice)."""
    import os

    import sluice

    minute = ctx.started_at.strftime("%Y-%m-%dT%H:%M")
    entry = sluice.enqueue_delivery(ctx.services, PAGER,
                                    os.environ.get("EXAMPLEAPP_DIGEST_PAGER", "team"),
                                    {"text": f"digest for {minute}"},
                                    idempotency_key=f"digest:{minute}")
    return {"enqueued": entry.id, "failed": 0}
