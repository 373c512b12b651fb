"""The operator, and what they see: failed delivery entries, read as
``GET /api/delivery/entries?status=failed`` lists them, purged or redriven as the console's
buttons do (the routes call these same store methods). A match is named by its entry's
public fields: (channel, recipient, story number in the payload).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from bench.simulate.invariants import Judge, Match
from bench.simulate.peers import STORY
from bench.simulate.rogue import Rogue

PURGE_SHARE = 0.7  # of the failed entries the operator looks at; the others are redriven


def match_of(entry: Any) -> Match:
    """(channel, recipient, story) of a delivery entry, from its public fields, named as the
    receivers record it (a webhook by its path on the one simulated host, as its rule's
    recipient is)."""
    text = " ".join(str(p) for p in entry.payload.get("payloads", []))
    found = STORY.search(text)
    recipient = entry.recipient
    if entry.channel == "webhook":
        recipient = urlsplit(recipient).path.strip("/")
    return entry.channel, recipient, int(found.group(1)) if found else -1


def like(entry: Any) -> dict[str, Any]:
    """What a producer would enqueue again for this entry."""
    return {"channel": entry.channel, "recipient": entry.recipient, "payload": entry.payload}


def match_of_like(copy: dict[str, Any]) -> str:
    found = STORY.search(" ".join(str(p) for p in copy["payload"].get("payloads", [])))
    return f"story-{found.group(1) if found else '?'} -> {copy['channel']}:{copy['recipient']}"


def observe_failed(services: Any, judge: Judge, now: datetime,
                   justified: Callable[[Match], str | None] = lambda match: "") -> None:
    """Entries failed for good are final for ``nothing_comes_back``; one newly seen failed
    must have a reason the world knows of (``justified``), else ``no_attempt_burned``."""
    from sluice.delivery.store import DeliveryStatus, DeliveryStore

    for entry in DeliveryStore(services.db).list(status=DeliveryStatus.FAILED, limit=500):
        match = match_of(entry)
        if match not in judge.final and judge.received[match] == 0 \
                and justified(match) is None:
            judge.fail("no_attempt_burned", now,
                       f"story-{match[2]} -> {match[0]}:{match[1]} failed for good "
                       f"({(entry.last_error or 'failed')[:100]}) although its destination "
                       "never refused it, it was younger than the expiry, and no timeout or "
                       "crash charged its attempts")
        judge.settled_for_good(match, now,
                               f"failed for good ({entry.last_error or 'failed'})"[:120])


def visit(services: Any, rng: random.Random, judge: Judge, rogue: Rogue, now: datetime,
          log: Callable[[str], None], faults: dict[str, int]) -> None:
    """The operator reads the failed entries and purges or redrives each."""
    from sluice.delivery.store import DeliveryStatus, DeliveryStore

    store = DeliveryStore(services.db)
    failed = sorted(store.list(status=DeliveryStatus.FAILED, limit=500), key=match_of)
    for entry in failed:
        match = match_of(entry)
        if rng.random() < PURGE_SHARE:
            store.purge(entry.id)
            judge.final[match] = (now, "purged by the operator")
            if rogue.name == "undo-purge":
                rogue.enqueue_copy(services, like(entry))
                log(f"rogue producer enqueued {match_of_like(like(entry))} again")
            faults["operator_purge"] = faults.get("operator_purge", 0) + 1
            log(f"operator purged story-{match[2]} -> {match[0]}:{entry.recipient}")
        else:
            store.redrive(entry.id)
            judge.redriven(match)
            faults["operator_redrive"] = faults.get("operator_redrive", 0) + 1
            log(f"operator redrove story-{match[2]} -> {match[0]}:{entry.recipient}")
    if not failed:
        log("operator: nothing failed")
