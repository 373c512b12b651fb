"""How a Python web app feeds Sluice, through the stable ``sluice`` API.

Four hooks an app has, one call each. Run one of them from a shell (CI does, for each):

    SLUICE_DATABASE_URL=... SLUICE_QUEUE_SIGNING_SECRET=... \\
        python docs/examples/app_python.py publish|deliver|usage|erase …

and it prints what Sluice answered, one JSON object a hook.
"""

from __future__ import annotations

import json
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

import sluice

# Once per process (module scope in a Lambda): settings are read and checked here, so a
# missing or invalid SLUICE_* variable fails at start-up with its name.
services = sluice.connect()


def on_feed_changed(source_id: str, feed_url: str) -> sluice.Published:
    """Ask the ingest pipeline to refresh one source: a signed message on ``rss.ingest``
    (SQS on AWS; the in-process consumer locally)."""
    published = sluice.publish(services, "rss.ingest", {"sourceId": source_id,
                                                        "feedUrl": feed_url})
    if not published.dispatched:
        # Not sent (locally: no consumer took it). Nothing was lost in Sluice; the app
        # decides whether to retry the call.
        print(f"not dispatched: {published.outcome}", file=sys.stderr)
    return published


def on_signup(user_id: str, webhook_url: str) -> sluice.DeliveryEntry:
    """Tell the customer's webhook about a new user. The entry is stored before any send;
    delivery-drain sends it and retries on its schedule. The key makes a repeated call
    (a retried request) store nothing new; the user id lets erasure find the entry."""
    return sluice.enqueue_delivery(services, "webhook", webhook_url,
                                   {"text": f"new user {user_id}"},
                                   idempotency_key=f"signup:{user_id}",
                                   subject_user_id=user_id)


def after_model_call(call_id: str, tenant_id: str, user_id: str, model: str,
                     input_tokens: int, output_tokens: int, cost_micros: int) -> str:
    """Write one AI model call to the usage ledger. ``call_id`` is the app's own stable id
    for the call: writing it twice records it once. When Postgres is unreachable the entry
    waits in Redis (``queued``) and ledger-redrive writes it later; the app carries on."""
    entry = sluice.UsageEntry(id=call_id, model=model, occurred_at=datetime.now(UTC),
                              tenant_id=tenant_id, user_id=user_id,
                              input_tokens=input_tokens, output_tokens=output_tokens,
                              cost_micros=cost_micros)
    return sluice.record_usage(services, entry)


def on_account_deleted(user_id: str) -> sluice.ErasureRequest:
    """Open an erasure request; erasure-purge deletes the user's data everywhere once the
    grace window (SLUICE_ERASURE_GRACE_DAYS) has passed."""
    return sluice.request_erasure(services, user_id, requested_by="app:account-deleted")


def main(hook: str) -> dict[str, Any]:
    if hook == "publish":
        return on_feed_changed("src-docs", "https://feeds.example.com/docs.xml").to_dict()
    if hook == "deliver":
        return on_signup("u-docs", "https://hooks.example.com/sluice").to_json()
    if hook == "usage":
        outcome = after_model_call(f"call-{uuid.uuid4()}", "t-docs", "u-docs",
                                   "gpt-4.1-mini", 104, 20, 1004)
        return {"outcome": outcome}
    if hook == "erase":
        return on_account_deleted("u-docs").to_json()
    raise SystemExit(f"usage: {sys.argv[0]} publish|deliver|usage|erase")


if __name__ == "__main__":
    for name in sys.argv[1:] or [""]:
        print(json.dumps(main(name), default=str))
