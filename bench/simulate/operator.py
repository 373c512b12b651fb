"""The operator, and what they see: failed delivery entries, read as
``GET /api/delivery/entries?status=failed`` lists them, purged or redriven as the console's
buttons do (the routes call these same store methods), and the destinations, as
``GET /api/admin/delivery/destinations`` shows them: one Sluice disabled is enabled once its
peer answers again, and what its disable failed is redriven (the runbook's steps), never
purged. A match is named by its entry's public fields: (channel, recipient, story number in
the payload).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from bench.simulate.hosts import hook_host, hook_url
from bench.simulate.invariants import Judge, Match
from bench.simulate.peers import STORY
from bench.simulate.rogue import Rogue

RETENTION_SLACK = timedelta(hours=1)
PURGE_SHARE = 0.7  # of the failed entries the operator looks at; the others are redriven
LISTED = 500  # the listing's longest page (``GET /api/delivery/entries?limit=``)


def match_of(entry: Any) -> Match:
    """(channel, recipient, story) of a delivery entry, from its public fields, named as the
    receivers record it (a webhook by its path, as its rule's recipient is)."""
    text = " ".join(str(p) for p in entry.payload.get("payloads", []))
    found = STORY.search(text)
    recipient = entry.recipient
    if entry.channel == "webhook":
        recipient = urlsplit(recipient).path.strip("/")
    return entry.channel, recipient, int(found.group(1)) if found else -1


def destination_of(channel: str, recipient: str) -> str:
    """The destination's key as Sluice names it (a webhook: its receiver's host and port)."""
    return f"webhook:{hook_host(recipient)}" if channel == "webhook" else f"{channel}:{recipient}"


def keys_of(channel: str, recipient: str) -> tuple[str, str]:
    """The two keys Sluice gives an entry of this match at its enqueue
    (``sluice.delivery.keys``): its destination (a webhook's exact URL: what a ``410``
    disables) and its receiver (a webhook's host and port: what an outage holds)."""
    from sluice.delivery.keys import keys_for

    found = keys_for(channel, hook_url(recipient) if channel == "webhook" else recipient)
    return found.destination, found.receiver


def honoured(judge: Judge, now: datetime, action: str, key: str, took: bool) -> None:
    """``operator_honoured``: an operator's change of a destination took effect."""
    if not took:
        judge.fail("operator_honoured", now, f"the operator's {action} of {key} did not "
                                             "take effect")


def like(entry: Any) -> dict[str, Any]:
    """What a producer would enqueue again for this entry."""
    return {"channel": entry.channel, "recipient": entry.recipient, "payload": entry.payload}


def match_of_like(copy: dict[str, Any]) -> str:
    found = STORY.search(" ".join(str(p) for p in copy["payload"].get("payloads", [])))
    return f"story-{found.group(1) if found else '?'} -> {copy['channel']}:{copy['recipient']}"


def observe_failed(services: Any, judge: Judge, now: datetime,
                   justified: Callable[[Match, Any], str | None] = lambda match, entry: ""
                   ) -> None:
    """Entries failed for good are final for ``nothing_comes_back``; one newly seen failed
    must have a reason the world knows of (``justified``, given the match and its entry),
    else ``no_attempt_burned``."""
    from sluice.delivery.store import DeliveryStatus, DeliveryStore

    for entry in DeliveryStore(services.db).list(status=DeliveryStatus.FAILED, limit=500):
        match = match_of(entry)
        if match not in judge.final and judge.received[match] == 0 \
                and justified(match, entry) is None:
            judge.fail("no_attempt_burned", now,
                       f"story-{match[2]} -> {match[0]}:{match[1]} failed for good "
                       f"({(entry.last_error or 'failed')[:100]}) although its destination "
                       "never refused it, it was younger than the expiry, and no timeout or "
                       "crash charged its attempts")
        judge.settled_for_good(match, now,
                               f"failed for good ({entry.last_error or 'failed'})"[:120])
        judge.failed_seen.setdefault(entry.id, (now, match))
        judge.failed_enqueued.setdefault(entry.id, entry.enqueued_at)


def retention_kept(judge: Judge, now: datetime, listed: set[str],
                   retention: timedelta, shown_from: datetime | None = None) -> None:
    """``retention_kept``: an entry the operator's listing showed failed is still listed
    (for the operator to purge or redrive) until the documented retention
    (``SLUICE_DELIVERY_RETENTION_DAYS``) from when it was first seen failed has passed, less
    ``RETENTION_SLACK`` (it failed in the drain run just before it was seen)."""
    for entry_id, (seen, match) in list(judge.failed_seen.items()):
        if now - seen >= retention - RETENTION_SLACK:
            del judge.failed_seen[entry_id]  # past its retention: it may be pruned now
        elif entry_id not in listed and not (
                shown_from is not None and judge.failed_enqueued.get(entry_id, now) <= shown_from):
            judge.fail("retention_kept", now,
                       f"story-{match[2]} -> {match[0]}:{match[1]} was listed failed at "
                       f"{seen:%Y-%m-%d %H:%M} and is gone {now - seen} later, within its "
                       f"{retention} retention, neither purged nor redriven")
            del judge.failed_seen[entry_id]


def _disabled(services: Any) -> list[dict[str, Any]]:
    """Every disabled destination, the view's pages read to the last."""
    from sluice.ops.destination_view import Page, view

    found: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        shown = view(services, Page(state="disabled", after=after))
        found.extend(shown["destinations"])
        after = shown["next"]
        if after is None:
            return found


def visit(services: Any, rng: random.Random, judge: Judge, rogue: Rogue, now: datetime,
          log: Callable[[str], None], faults: dict[str, int],
          answers: Callable[[str], bool] = lambda key: True,
          refused: Callable[[Match], bool] = lambda match: True) -> list[Match]:
    """The operator enables each disabled destination that ``answers`` again, then reads the
    failed entries: what a disable failed without its destination refusing it
    (``refused``: the message the destination refused is judged like any failed one) is
    redriven once its destination is enabled (left while it is not); each other one purged
    or redriven. The matches redriven while their destination is enabled after a disable
    (owed again: no loss is excused by a disable)."""
    from sluice.delivery.store import DeliveryStatus, DeliveryStore
    from sluice.ops.destinations import apply, parse_change

    disabled = set()
    for destination in _disabled(services):
        key = destination["key"]
        if answers(key):
            enabled = apply(services, parse_change("enable", key, {}))
            faults["operator_enable"] = faults.get("operator_enable", 0) + 1
            log(f"operator enabled {key} ({destination['disabled']['reason'][:60]})")
            honoured(judge, now, "enable", key, enabled["current"]["state"] != "disabled")
        else:
            disabled.add(key)
    store = DeliveryStore(services.db)
    failed = sorted(store.list(status=DeliveryStatus.FAILED, limit=LISTED), key=match_of)
    # a full page shows the newest only (by enqueue): an entry older than its oldest is not
    # gone, only not shown
    shown_from = min(e.enqueued_at for e in failed) if len(failed) >= LISTED else None
    retention_kept(judge, now, {entry.id for entry in failed},
                   timedelta(days=services.settings.delivery_retention_days), shown_from)
    owed: list[Match] = []
    for entry in failed:
        match = match_of(entry)
        if entry.failure_reason == "destination_disabled" and not refused(match):
            if not {entry.destination, entry.receiver} & disabled:
                store.redrive(entry.id)
                judge.failed_seen.pop(entry.id, None)
                judge.redriven(match)
                owed.append(match)
                faults["operator_redrive"] = faults.get("operator_redrive", 0) + 1
                log(f"operator redrove story-{match[2]} -> {match[0]}:{entry.recipient} "
                    "(its destination enabled)")
            continue
        if rng.random() < PURGE_SHARE:
            store.purge(entry.id)
            judge.failed_seen.pop(entry.id, None)
            judge.final[match] = (now, "purged by the operator")
            if rogue.name == "undo-purge":
                rogue.enqueue_copy(services, like(entry))
                log(f"rogue producer enqueued {match_of_like(like(entry))} again")
            faults["operator_purge"] = faults.get("operator_purge", 0) + 1
            log(f"operator purged story-{match[2]} -> {match[0]}:{entry.recipient}")
        else:
            store.redrive(entry.id)
            judge.failed_seen.pop(entry.id, None)
            judge.redriven(match)
            if entry.failure_reason == "destination_disabled" and not {
                    entry.destination, entry.receiver} & disabled:
                owed.append(match)
            faults["operator_redrive"] = faults.get("operator_redrive", 0) + 1
            log(f"operator redrove story-{match[2]} -> {match[0]}:{entry.recipient}")
    if not failed:
        log("operator: nothing failed")
    return owed
