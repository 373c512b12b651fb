""""Why is this waiting?": what holds one delivery entry, and until when, in one sentence.

The answer is read from what the drain reads, and decided by the rules it decides with:
its destination's and receiver's state rows as the drain's last check before a request
reads them (``destinations.stop_of``: a disable, by ``Control.disables``, so an entry an
operator restarted after it goes, before a pause, as ``Policy.before_send`` orders them),
a failing receiver's next probe (its
probe is the entry due first, as the claim takes it), the receiver's ``ready_at`` (a rate
slot, or the wait its provider asked for), the entry's own due time (the schedule), its
expiry (``DeliveryStore.expire``: from its enqueue or last restart, never while paused),
its lease (``Policy.after_lapse`` says what the next drain makes of a lapsed one), or its
final state. Several holds at once: the entry waits for the one that ends last.

``explain`` decides from values (the entry, its state rows, the time); ``why`` reads them.
The claim itself decides in SQL (``claim`` in store/sql/delivery.sql):
tests/integration/delivery/test_why.py brings an entry to every row of the policy and every
kind below, asks, then runs the drain and checks that it does what the answer says.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from sluice.core.times import iso_z, iso_z_or_none
from sluice.delivery.channels import Outbound, build_adapters, deduplicating
from sluice.delivery.destinations import Control, Destinations, Stop, _time_or_none, stop_of
from sluice.delivery.policy import (
    TABLE,
    DeliveryOutcome,
    DeliveryStatus,
    Due,
    Policy,
)
from sluice.delivery.store import UNCONFIGURED, DeliveryEntry, DeliveryStore
from sluice.store.db import Row, load_queries, utcnow

if TYPE_CHECKING:
    from sluice.core.services import Services
    from sluice.core.settings import Settings

Q = load_queries("why")


class Hold(StrEnum):
    """What an entry waits for (``kind`` in the answer)."""

    DUE = "due"  # nothing: the next drain sends it
    SCHEDULE = "schedule"  # its own next attempt (the retry schedule)
    PROBE = "probe"  # its receiver is failing: its next probe
    SLOT = "slot"  # its receiver's next rate slot
    PROVIDER = "provider"  # the wait its provider asked for
    PAUSED = "paused"  # an operator's pause of its destination or receiver
    UNCONFIGURED = "unconfigured"  # its channel has no credential
    DISABLED = "disabled"  # the next drain fails it destination_disabled, unsent
    EXPIRED = "expired"  # past its expiry: the next drain fails it expired, unsent
    IN_FLIGHT = "in_flight"  # a sender holds its lease
    SENT = "sent"
    FAILED = "failed"
    UNKNOWN = "unknown"  # sent without an answer, resting for an operator


# The hold of a pending entry as the policy's next-due column names it (docs/delivery.md).
HOLD_OF_DUE: dict[Due, Hold] = {
    Due.NOW: Hold.DUE, Due.SCHEDULE: Hold.SCHEDULE, Due.PROBE: Hold.PROBE,
    Due.SLOT: Hold.SLOT, Due.PROVIDER: Hold.PROVIDER, Due.PAUSE_END: Hold.PAUSED,
    Due.CONFIGURED: Hold.UNCONFIGURED}
# ... and of an entry at rest, by its status.
HOLD_OF_STATUS: dict[str, Hold] = {
    DeliveryStatus.ACKED: Hold.SENT, DeliveryStatus.FAILED: Hold.FAILED,
    DeliveryStatus.UNKNOWN: Hold.UNKNOWN, DeliveryStatus.IN_FLIGHT: Hold.IN_FLIGHT}
# Of two holds ending at the same time, the one named (a provider's wait sets the entry's
# own due time and its receiver's ready_at alike; a probe's wait, its due time and the
# receiver's next probe).
_RANK = (Hold.SCHEDULE, Hold.SLOT, Hold.PROVIDER, Hold.PROBE, Hold.PAUSED)
_MOMENT = timedelta(seconds=1)


class Why(NamedTuple):
    id: str
    status: str
    kind: Hold
    until: datetime | None  # when the hold ends (None: not by itself)
    sentence: str
    key: str | None = None  # the destination or receiver that holds it
    expires_at: datetime | None = None  # a pending entry's expiry

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "kind": self.kind.value,
                "until": iso_z_or_none(self.until), "sentence": self.sentence, "key": self.key,
                "expiresAt": iso_z_or_none(self.expires_at)}


class _Timed(NamedTuple):
    kind: Hold
    until: datetime
    key: str | None
    says: str


def explain(entry: DeliveryEntry, states: list[Row], now: datetime, *, policy: Policy,
            expire: timedelta, configured: Collection[str] | None = None,
            first_in_line: str | None = None) -> Why:
    """What holds ``entry`` at ``now``: ``states`` are its destination's and receiver's rows,
    ``configured`` the channels with an adapter (None: as the last drain found them),
    ``first_in_line`` its failing receiver's entry due first (its probe)."""
    status = entry.status.value
    if entry.status is DeliveryStatus.IN_FLIGHT:
        return _in_flight(entry, now, policy)
    if entry.status is not DeliveryStatus.PENDING:
        return _at_rest(entry)
    paused = [c for c in map(Control.from_row, states) if c.paused(now)]
    expires_at = (entry.started_at or entry.enqueued_at) + expire
    if not paused and expires_at <= now:  # the drain expires before it does anything else
        return Why(entry.id, status, Hold.EXPIRED, None,
                   f"Not sent within its expiry ({iso_z(expires_at)}): the next drain fails "
                   "it expired, unsent; an operator may redrive it.", expires_at=expires_at)
    stop = stop_of(states, entry, now, policy)
    if stop is not None and stop.outcome is DeliveryOutcome.DESTINATION_DISABLED:
        off = stop.control
        return Why(entry.id, status, Hold.DISABLED, None,
                   f"Disabled since {iso_z_or_none(off.disabled_at)}: {off.key} "
                   f"({off.disabled_reason or 'no reason given'}); the next drain fails it "
                   "destination_disabled, unsent, and once the key is enabled an operator "
                   "may redrive it.",
                   key=off.key, expires_at=expires_at)
    unconfigured = (entry.channel not in configured if configured is not None
                    else (entry.held_by or "").startswith(UNCONFIGURED))
    if unconfigured:
        return Why(entry.id, status, Hold.UNCONFIGURED, None,
                   f"Its channel {entry.channel} has no credential configured: it waits, "
                   f"attempts untouched, until it has one (it expires at "
                   f"{iso_z(expires_at)}).", expires_at=expires_at)
    expiry = ("nothing expires while paused" if paused
              else f"it expires at {iso_z(expires_at)} unless sent before")
    timed = _timed(entry, states, stop, now, first_in_line,
                   configured is not None and bool(entry.held_by))
    if not timed:
        probe = first_in_line == entry.id and _failing(states, entry)
        what = ("as its failing receiver's probe" if probe
                else f"as attempt {entry.attempts + 1}")
        return Why(entry.id, status, Hold.DUE, None,
                   f"Nothing holds it: due now, the next drain sends it {what} ({expiry}).",
                   expires_at=expires_at)
    until = max(hold.until for hold in timed)
    # what ends with the last one, give or take a moment (an entry set aside for its
    # receiver's probe is due with it), is named by its rank
    last = max((hold for hold in timed if until - hold.until <= _MOMENT),
               key=lambda hold: _RANK.index(hold.kind))
    return Why(entry.id, status, last.kind, until,
               f"{last.says} ({expiry}).", key=last.key, expires_at=expires_at)


def _failing(states: list[Row], entry: DeliveryEntry) -> bool:
    receiver = next((row for row in states if row["key"] == entry.receiver), None)
    return (receiver is not None and receiver["down_since"] is not None
            and receiver["disabled_at"] is None)


def _timed(entry: DeliveryEntry, states: list[Row], stop: Stop | None, now: datetime,
           first_in_line: str | None, released: bool) -> list[_Timed]:
    """Every hold that ends at a time, as the claim reads them. A pause's end makes the
    entry due at once (the drain restarts it), so its own due time counts only unpaused;
    one set aside for a channel configured since is due at once too (``released``)."""
    holds: list[_Timed] = []
    if stop is not None:  # paused: a disable answered before
        end = stop.control
        assert end.paused_until is not None
        holds.append(_Timed(Hold.PAUSED, end.paused_until, end.key,
                            f"Paused by an operator until {iso_z(end.paused_until)}: nothing "
                            f"of {end.key} is sent before, no attempt counted"))
    elif entry.next_attempt_at > now and not released:
        holds.append(_Timed(Hold.SCHEDULE, entry.next_attempt_at, None,
                            f"Waiting out its retry schedule after {entry.attempts} failed "
                            f"attempt(s): due at {iso_z(entry.next_attempt_at)}"
                            + (f" (last: {entry.last_error})" if entry.last_error else "")))
    receiver = next((row for row in states if row["key"] == entry.receiver), None)
    if receiver is None:
        return holds
    if _failing(states, entry):
        probe_at = _time_or_none(receiver["next_probe_at"])
        since = iso_z_or_none(_time_or_none(receiver["down_since"]))
        failing = (f"Its receiver {receiver['key']} is failing since {since} "
                   f"({receiver['failures']} in a row; last: {receiver['last_error']})")
        if probe_at is not None and probe_at > now:
            holds.append(_Timed(Hold.PROBE, probe_at, receiver["key"],
                                f"{failing}: only its probe goes, at {iso_z(probe_at)}, "
                                "no attempt counted"))
        elif first_in_line not in (None, entry.id):
            holds.append(_Timed(Hold.PROBE, probe_at or now, receiver["key"],
                                f"{failing}: its probe (entry {first_in_line}) goes first, "
                                "this one after the probe's success"))
    ready_at = _time_or_none(receiver["ready_at"])
    if ready_at is not None and ready_at > now:
        asked = entry.next_attempt_at >= ready_at  # the provider's wait was set on it too
        holds.append(_Timed(
            Hold.PROVIDER if asked else Hold.SLOT, ready_at, receiver["key"],
            f"Its receiver {receiver['key']} "
            + ("asked to wait" if asked else "has no rate slot")
            + f" until {iso_z(ready_at)}, no attempt counted"))
    return holds


def _in_flight(entry: DeliveryEntry, now: datetime, policy: Policy) -> Why:
    left = (f"its request left at {iso_z(entry.request_left_at)}" if entry.request_left_at
            else "its request has not left")
    lease = entry.lease_until or entry.next_attempt_at
    if lease > now:
        return Why(entry.id, entry.status.value, Hold.IN_FLIGHT, lease,
                   f"A sender holds it (attempt {entry.attempts}) until {iso_z(lease)}; "
                   f"{left}.")
    outcome = policy.after_lapse(entry.channel, entry.attempts, entry.unknown_sends,
                                 request_left=entry.request_left_at is not None,
                                 unsent_lapses=entry.unsent_lapses)
    row = TABLE[outcome]
    then = {DeliveryStatus.PENDING: "due at once, the drain sends it again",
            DeliveryStatus.UNKNOWN: "it rests unknown for an operator",
            DeliveryStatus.FAILED: f"it fails {row.reason.value if row.reason else ''}"}
    return Why(entry.id, entry.status.value, Hold.IN_FLIGHT, lease,
               f"Its sender's lease lapsed at {iso_z(lease)} ({left}): the next drain "
               f"settles it as \"{outcome.value}\", {then[DeliveryStatus(row.status)]}.")


def _at_rest(entry: DeliveryEntry) -> Why:
    status = entry.status.value
    if entry.status is DeliveryStatus.ACKED:
        message = f" (message {entry.platform_message_id})" if entry.platform_message_id else ""
        return Why(entry.id, status, Hold.SENT, None,
                   f"Sent at {iso_z_or_none(entry.acked_at)}{message}: nothing holds it.")
    if entry.status is DeliveryStatus.FAILED:
        return Why(entry.id, status, Hold.FAILED, None,
                   f"Failed {entry.failure_reason} at {iso_z_or_none(entry.failed_at)}"
                   f" ({entry.last_error or 'no error recorded'}): only an operator sends it "
                   "again (redrive).")
    return Why(entry.id, status, Hold.UNKNOWN, None,
               f"Sent {entry.unknown_sends} time(s) without an answer, resting unknown since "
               f"{iso_z(entry.updated_at)}: it may have arrived, and only an operator marks it "
               "delivered, sends it again or purges it.")


def configured_channels(settings: Settings) -> frozenset[str]:
    """The channels with an adapter under ``settings`` (as a drain builds them)."""
    with Outbound.open(settings) as client:
        return frozenset(build_adapters(settings, client))


def why(services: Services, entry_id: str, *, now: datetime | None = None,
        configured: Collection[str] | None = None) -> Why:
    """What holds the entry ``entry_id`` now, read from the store (``NotFound`` when there
    is no such entry)."""
    settings = services.settings
    now = now or utcnow()
    entry = DeliveryStore(services.db).get(entry_id)
    destinations = Destinations(services.db, settings.delivery_outage_threshold)
    states = destinations.states(entry) if entry.status is DeliveryStatus.PENDING else []
    first = None
    if entry.receiver and _failing(states, entry):
        with services.db.transaction() as tx:
            row = tx.fetchone(Q.first_in_line, {"receiver": entry.receiver, "now": now})
        first = row["id"] if row else None
    return explain(entry, states, now,
                   policy=Policy.from_settings(settings).knowing(deduplicating()),
                   expire=timedelta(seconds=settings.delivery_expire_s),
                   configured=(configured if configured is not None
                               else configured_channels(settings)),
                   first_in_line=first)


__all__ = ["HOLD_OF_DUE", "HOLD_OF_STATUS", "Hold", "Why", "configured_channels", "explain",
           "why"]
