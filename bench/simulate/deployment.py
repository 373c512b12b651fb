"""The simulated deployment: its settings, its ids drawn from the seed, and how a job's
result is summarised in the history (counts only: ids and timings would make the digest
depend on the machine)."""

from __future__ import annotations

import os
import random
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.simulate.peers import POLAR, SLACK, TELEGRAM

# The secret the deployment signs webhooks with, and the simulated receivers verify with.
WEBHOOK_SECRET = "sim-webhook-signing-secret"


def passed_settings() -> dict[str, str]:
    """The ``SLUICE_DELIVERY_*`` and ``SLUICE_RSS_*`` settings taken from the environment
    (sorted): they change a history, so the digest starts from them and a replay names them."""
    return {k: os.environ[k] for k in sorted(os.environ)
            if k.startswith(("SLUICE_DELIVERY_", "SLUICE_RSS_"))}


def settings_env(directory: Path, redis_prefix: str, *, pipeline: bool = False,
                 database_url: str | None = None) -> dict[str, str]:
    """The settings of the simulated deployment; ``SLUICE_DELIVERY_*`` and ``SLUICE_RSS_*``
    from the environment pass through (to try a retention, an attempt limit…). With
    ``pipeline`` the push queues are SQS (the stand-in of ``queues.py``)."""
    passed = passed_settings()
    queues = {"SLUICE_QUEUE_MODE": "sqs", "SLUICE_QUEUE_PREFIX": "sluice-sim-",
              "SLUICE_QUEUE_SIGNING_SECRET": "sim-queue-signing-secret-0123456789"
              } if pipeline else {}
    return passed | queues | {
        "SLUICE_DATABASE_URL": database_url or f"sqlite:///{directory}/sim.db",
        "SLUICE_TELEGRAM_BOT_TOKEN": "123:sim",
        "SLUICE_TELEGRAM_API_URL": f"http://{TELEGRAM}",
        "SLUICE_SLACK_BOT_TOKEN": "xoxb-sim",
        "SLUICE_SLACK_API_URL": f"http://{SLACK}",
        "SLUICE_WEBHOOK_SIGNING_SECRET": WEBHOOK_SECRET,
        "SLUICE_FEED_ALLOW_HOSTS": "127.0.0.1",
        "SLUICE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
        "POLAR_ACCESS_TOKEN": "polar-sim-token",
        "POLAR_API_URL": f"http://{POLAR}",
        # Redis configured, so the ledger's retry queue, the delivery rates and the build
        # locks take their Redis paths; the client is ``simulated_redis``, and this address
        # is never dialled (port 1: a client built from it would find nothing there)
        "SLUICE_REDIS_URL": "redis://127.0.0.1:1/0",
        "SLUICE_REDIS_KEY_PREFIX": redis_prefix,
        # one send at a time: with several in flight, thread scheduling would decide the
        # order of effects, and a seed would no longer fix its history
        "SLUICE_DELIVERY_DRAIN_CONCURRENCY": "1",
    }


@contextmanager
def seeded_ids(seed: int) -> Iterator[None]:
    """``uuid.uuid4`` drawn from the seed: ids decide some orders (claims, listings).

    Sluice's own draws (and the simulator's) come from a stream of their own: a library
    drawing ids once per process (``opentelemetry`` at its import) would otherwise shift
    every id after it, and a seed run after another in the same process, or alone, would
    not have the same history."""
    ids = random.Random(f"ids-{seed}")
    others = random.Random(f"library-ids-{seed}")
    original = uuid.uuid4

    def uuid4() -> uuid.UUID:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        stream = ids if caller.startswith(("sluice.", "bench.")) else others
        return uuid.UUID(int=stream.getrandbits(128), version=4)

    uuid.uuid4 = uuid4
    try:
        yield
    finally:
        uuid.uuid4 = original


def brief(body: dict[str, Any]) -> str:
    """The counts of a job's result (ids and timings left out: the digest must not see them)."""
    keep = ("recovered", "failed", "skippedMaxRetries", "unknown", "expired", "enqueued",
            "outages", "deleted", "purged", "processed", "succeeded", "requeued",
            "deadLettered", "erased", "reason")
    parts = []
    for key in keep:
        value = body.get(key)
        if key == "outages" and isinstance(value, dict):
            value = value.get("count")
        if (isinstance(value, int) and value) or (key == "reason" and isinstance(value, str)):
            parts.append(f"{key}={value}")
    sweep = body.get("alertSweep")
    if isinstance(sweep, dict) and sweep.get("enqueued"):
        parts.append(f"enqueued={sweep['enqueued']}")
    return " ".join(parts)


def simulated_redis(prefix: str) -> Any:
    """Sluice's Redis client (``RedisPyClient``, the one ``connect`` builds) on a Redis
    server of the seed's own: ``fakeredis``, running the same Lua scripts (``lupa``), whose
    key expiry reads ``time.time`` — the simulated clock. A real Redis server expires keys
    on the wall clock: a build lock left by a failed release (``PX``, the build deadline
    and 30 s) outlived weeks of simulated time, or not, depending on how fast the machine
    ran, and so did the history of the seed."""
    import fakeredis

    from sluice.store.redis_clients import RedisPyClient

    return RedisPyClient(fakeredis.FakeRedis(server=fakeredis.FakeServer(),
                                             decode_responses=True), prefix)
