"""What Sluice knows of each destination and receiver, and what an operator sets on them.

Every entry names its destination (the exact URL or chat) and its receiver (where its rates
and outages live) from its enqueue (``sluice.delivery.keys``); ``delivery_destinations``
holds a row for a key Sluice knows a state of. The claim reads these rows for every entry
it takes (``sluice.delivery.store``), so a state holds from the moment it is written and
no entry is moved to hold it:

- *failing* (a receiver): from a failure that is the receiver's (not reached, refusing
  Sluice's credentials, or a second entry failing before a success: ``Policy.after_send``)
  until its next success. Its entries stay pending, attempts untouched, and only its probe
  is claimed, when due (``Policy.probe_wait``: the retry schedule's 5 s, 25 s, 2 min, 10 min,
  then every 10 min, or the provider's honoured wait when longer); the probe is the entry
  due first, and a failed probe goes behind the others, so the probes go round them. It is
  *reported* (run summary, ``/api/queue/status``, the console, the
  ``DeliveryDestinationsDown`` metric and its alarm) once ``threshold`` probes in a row
  failed. An answered failure of one entry alone only names that entry (``suspect_entry``):
  it is the entry's own, counted on the schedule.
- *paced* (a receiver) until ``ready_at``: no rate slot before then, or the provider asked
  to wait; nothing of it is claimed before.
- *paused* until a time by an operator (a destination or a receiver): nothing of it is
  claimed, nothing counted, nothing expires; at the pause's end (``resume`` or ``lapse``)
  its entries' expiry is read from then.
- *disabled* (a ``410 Gone`` or a chat gone disables that destination; days failing
  without a success disable the receiver; an operator either): its pending entries fail
  ``destination_disabled`` at once, attempts untouched, no request made, and so does each
  later one at the next drain; an entry an operator restarts after the disable goes once,
  as asked. Enabled again, it starts afresh.

An operator may also override a receiver's rate until a time (``sluice.delivery.ratelimit``
reads the overrides in force). What each state means for an entry is the policy's
(``sluice.delivery.policy``); this module keeps the states.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, NamedTuple

from sluice.core.errors import RequestError
from sluice.core.times import iso_z_or_none
from sluice.delivery.channels import channels, check_recipient
from sluice.delivery.keys import SMTP_RECEIVER, webhook_receiver
from sluice.delivery.policy import DELIVERY_POLICY, DeliveryOutcome, Policy
from sluice.delivery.store import DeliveryEntry, queue_turn
from sluice.store.db import Database, Row, load_queries, utcnow

Q = load_queries("delivery")

MAX_KEY_LENGTH = 2100  # a webhook destination is its URL


def _time(value: Any) -> datetime:
    if isinstance(value, str):  # SQLite's RETURNING hands back stored text
        return datetime.fromisoformat(value).astimezone(UTC)
    assert isinstance(value, datetime)
    return value


def _time_or_none(value: Any) -> datetime | None:
    return None if value is None else _time(value)


def check_key(key: str) -> str:
    """A destination or receiver key as an operator gives it, read into the form entries
    carry (``sluice.delivery.keys``): ``<channel>:<recipient>`` with the recipient as the
    channel checks it (``webhook:https://hooks.example.com/a``, ``telegram:-1001``), or a
    receiver (``webhook:hooks.example.com:443``, ``email:smtp``); a 400 naming
    ``destination`` for a key no entry can have."""
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH or not key.isprintable():
        raise RequestError(f"a destination is its key (such as telegram:1001 or "
                           f"webhook:hooks.example.com:443), 1 to {MAX_KEY_LENGTH} printable "
                           "characters", field="destination")
    channel, colon, rest = key.partition(":")
    if not colon or channel not in channels():
        raise RequestError(f"{key!r} names no channel Sluice has: a key is <channel>:<recipient>"
                           f" with channel one of {', '.join(sorted(channels()))}",
                           field="destination")
    if channel == "webhook" and not rest.lower().startswith(("https://", "http://")):
        return _webhook_receiver_key(rest)
    if key == SMTP_RECEIVER:
        return key
    return f"{channel}:{check_recipient(channel, rest, field='destination')}"


def _webhook_receiver_key(rest: str) -> str:
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        raise RequestError(f"a webhook destination is its URL, or its receiver "
                           f"webhook:<host>:<port> (such as webhook:{rest}:443)",
                           field="destination")
    if not port:
        raise RequestError(f"webhook:{rest} names no port: a webhook receiver's key "
                           f"always names it, webhook:{host}:443 for https or "
                           f"webhook:{host}:80 for http", field="destination")
    if not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise RequestError(f"webhook:{rest}: the port must be a number from 1 to 65535",
                           field="destination")
    # read as an entry's URL is read (``webhook_receiver``), so the two never disagree
    found = webhook_receiver(f"https://{f'[{host}]' if ':' in host else host}:{int(port)}/")
    if found is None:
        raise RequestError(f"webhook:{rest}: {host!r} is not a host name or address",
                           field="destination")
    return f"webhook:{found}"


class FailingDestination(NamedTuple):
    key: str
    down_since: datetime
    failures: int
    last_error: str | None
    next_probe_at: datetime

    @classmethod
    def from_row(cls, row: Row) -> FailingDestination:
        return cls(row["key"], _time(row["down_since"]), int(row["failures"]), row["last_error"],
                   _time(row["next_probe_at"]))


class Control(NamedTuple):
    """What stops sends to a destination now: disabled, or paused until a time."""

    key: str
    paused_until: datetime | None
    disabled_at: datetime | None
    disabled_reason: str | None

    def paused(self, now: datetime) -> bool:
        return self.paused_until is not None and self.paused_until > now

    def disables(self, entry: DeliveryEntry) -> bool:
        """Whether its disable stops ``entry`` (one an operator restarted after it goes,
        as the claim's SQL lets it)."""
        return self.disabled_at is not None and (entry.restarted_at is None
                                                 or entry.restarted_at <= self.disabled_at)

    @classmethod
    def from_row(cls, row: Row) -> Control:
        return cls(row["key"], _time_or_none(row["paused_until"]),
                   _time_or_none(row["disabled_at"]), row["disabled_reason"])


class Stop(NamedTuple):
    """What stops an entry now, as the policy names it, and the key's state that does."""

    outcome: DeliveryOutcome  # DESTINATION_DISABLED or DESTINATION_PAUSED
    control: Control


def stop_of(states: list[Row], entry: DeliveryEntry, now: datetime,
            policy: Policy = DELIVERY_POLICY) -> Stop | None:
    """What of its destination's and receiver's ``states`` stops ``entry`` at ``now``: a
    disable of it before a pause (``Policy.before_send``), a pause by the one ending last
    (the entry waits for both); None when neither does. The claim's SQL reads the same."""
    controls = [Control.from_row(row) for row in states]
    off = next((c for c in controls if c.disables(entry)), None)
    paused = max((c for c in controls if c.paused(now)), default=None,
                 key=lambda c: c.paused_until or now)
    outcome = policy.before_send(disabled=off is not None, paused=paused is not None)
    if outcome is None:
        return None
    control = off if outcome is DeliveryOutcome.DESTINATION_DISABLED else paused
    assert control is not None
    return Stop(outcome, control)


class Streak(NamedTuple):
    """A receiver's failures since its last success: held as failing, or an answered
    failure of one entry (``suspect``) alone so far."""

    failing: FailingDestination | None
    suspect: str | None


class Destinations:
    def __init__(self, db: Database, threshold: int, policy: Policy = DELIVERY_POLICY) -> None:
        self.db = db
        self.threshold = threshold
        self.policy = policy

    # --- failing --------------------------------------------------------------------

    def load(self) -> dict[str, FailingDestination]:
        """The receivers failing now (a disabled one is not probed, so not among them)."""
        with self.db.transaction() as tx:
            return {row["key"]: FailingDestination.from_row(row)
                    for row in tx.fetchall(Q.destinations_failing)}

    def streak(self, key: str) -> Streak:
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.destination_get, {"key": key})
        if row is None:
            return Streak(None, None)
        failing = (FailingDestination.from_row(row)
                   if row["down_since"] is not None and row["disabled_at"] is None else None)
        return Streak(failing, row["suspect_entry"])

    def suspect(self, key: str, entry_id: str, *, now: datetime | None = None) -> None:
        """``entry_id``'s own failure at ``key``: named, unless an earlier one is."""
        with self.db.transaction() as tx:
            tx.execute(Q.destination_suspect, {"key": key, "entry": entry_id,
                                               "now": now or utcnow()}, final=True)

    def failed(self, key: str, error: str, *, known: FailingDestination | None,
               asked_s: float | None = None,
               now: datetime | None = None) -> FailingDestination:
        """One more failure of ``key`` as a whole: its next probe when the policy says."""
        now = now or utcnow()
        wait = self.policy.probe_wait((known.failures if known else 0) + 1, asked_s)
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.destination_failed, {
                "key": key, "now": now, "error": error[:500],
                "next_probe_at": now + wait}, final=True)
        assert row is not None
        return FailingDestination.from_row(row)

    def spread(self, suspect: str, *, now: datetime | None = None) -> bool:
        """A second entry failed at the receiver ``suspect`` named first: the receiver is
        what fails, so the attempt the suspect's failure counted is given back (while it
        waits). Whether it was."""
        with self.db.transaction() as tx:
            return tx.execute(Q.give_back_attempt, {"id": suspect, "now": now or utcnow()},
                              final=True) == 1

    def up(self, key: str, *, now: datetime | None = None) -> None:
        """``key`` took an entry: no longer failing, no entry suspected."""
        with self.db.transaction() as tx:
            tx.execute(Q.destination_up, {"key": key, "now": now or utcnow()}, final=True)

    def paced(self, key: str, until: datetime, *, now: datetime | None = None) -> None:
        """No slot for ``key`` before ``until`` (or its provider asked to wait so long)."""
        with self.db.transaction() as tx:
            tx.execute(Q.destination_paced, {"key": key, "until": until,
                                             "now": now or utcnow()}, final=True)

    def next_ready(self, *, now: datetime | None = None) -> datetime | None:
        """When the first receiver whose due entries wait only for a rate slot has one."""
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.next_ready, {"now": now or utcnow()})
        return _time_or_none(row["at"]) if row else None

    def reported(self, destination: FailingDestination) -> bool:
        return destination.failures >= self.threshold

    def status(self) -> list[dict[str, Any]]:
        """Every receiver known to be failing, with how many entries wait on it."""
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.destinations_failing)
            waiting = {row["key"]: int(row["n"]) for row in tx.fetchall(Q.receivers_waiting)}
        out = []
        for row in rows:
            found = FailingDestination.from_row(row)
            out.append({"key": found.key, "down": self.reported(found),
                        "downSince": iso_z_or_none(found.down_since),
                        "failures": found.failures, "waiting": waiting.get(found.key, 0),
                        "nextProbeAt": iso_z_or_none(found.next_probe_at),
                        "lastError": found.last_error})
        return out

    def paused_waiting(self, *, now: datetime | None = None) -> int:
        """Pending entries whose destination or receiver is paused now."""
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.paused_waiting, {"now": now or utcnow()})
        return int(row["n"]) if row else 0

    # --- what stops sends -------------------------------------------------------------

    def stop(self, entry: DeliveryEntry, *, now: datetime | None = None) -> Stop | None:
        """What stops ``entry`` now: its destination's or its receiver's disable or pause
        (``stop_of``)."""
        return stop_of(self.states(entry), entry, now or utcnow(), self.policy)

    def states(self, entry: DeliveryEntry) -> list[Row]:
        """The state rows Sluice holds for ``entry``'s destination and receiver (the rows
        the claim and ``request_left`` read for it), the destination's first."""
        with self.db.transaction() as tx:
            rows = [tx.fetchone(Q.destination_get, {"key": key})
                    for key in dict.fromkeys((entry.destination, entry.receiver)) if key]
        return [row for row in rows if row is not None]

    def disable(self, key: str, reason: str, *, now: datetime | None = None) -> int:
        """Disable ``key`` (a destination disabled already keeps its first reason): its
        pending entries fail ``destination_disabled`` in the same transaction, attempts
        untouched. How many entries failed so."""
        now = now or utcnow()
        with self.db.transaction() as tx:
            queue_turn(tx)
            tx.execute(Q.destination_disable, {"key": key, "now": now, "reason": reason[:500]})
            return tx.execute(Q.fail_destination, {"key": key, "now": now, "disabled_at": now,
                                                   "reason": reason[:500]}, final=True)

    def fail_disabled(self, *, now: datetime | None = None) -> dict[str, int]:
        """Entries enqueued for a disabled destination or receiver since its disable (or
        left when it began): failed ``destination_disabled``, per key."""
        now = now or utcnow()
        failed: dict[str, int] = {}
        with self.db.transaction() as tx:
            queue_turn(tx)
            for row in tx.fetchall(Q.disabled_with_pending):
                n = tx.execute(Q.fail_destination, {
                    "key": row["key"], "now": now, "disabled_at": row["disabled_at"],
                    "reason": row["disabled_reason"] or "disabled"})
                if n:
                    failed[row["key"]] = n
        return failed

    def enable(self, key: str, *, now: datetime | None = None) -> bool:
        """Enable ``key`` afresh (no failures counted); False when it was not disabled."""
        with self.db.transaction() as tx:
            return tx.execute(Q.destination_enable, {"key": key, "now": now or utcnow()},
                              final=True) == 1

    def pause(self, key: str, until: datetime, *, now: datetime | None = None) -> int:
        """Pause ``key`` until ``until``: nothing of it is claimed from now. How many of its
        entries are pending or in flight (those in flight whose request has not left are
        not sent: ``request_left`` reads the pause)."""
        now = now or utcnow()
        with self.db.transaction() as tx:
            tx.execute(Q.destination_pause, {"key": key, "until": until, "now": now})
            rows = tx.fetchall(Q.destination_entries, {"key": key})
        return sum(int(row["n"]) for row in rows)

    def resume(self, key: str, *, now: datetime | None = None) -> int:
        """End ``key``'s pause now: its entries may be claimed at once, their expiry read
        from now. How many pending entries it released (0 when it was not paused)."""
        now = now or utcnow()
        with self.db.transaction() as tx:
            queue_turn(tx)
            if tx.fetchone(Q.destination_resume, {"key": key, "now": now}) is None:
                return 0
            return tx.execute(Q.restart_expiry, {"key": key, "now": now}, final=True)

    def override_rate(self, key: str, limit: float, period_s: int, until: datetime, *,
                      now: datetime | None = None) -> None:
        with self.db.transaction() as tx:
            tx.execute(Q.destination_rate, {"key": key, "rate_limit": limit,
                                            "rate_period_s": period_s, "until": until,
                                            "now": now or utcnow()}, final=True)

    def clear_rate(self, key: str, *, now: datetime | None = None) -> bool:
        with self.db.transaction() as tx:
            return tx.execute(Q.destination_rate_clear, {"key": key, "now": now or utcnow()},
                              final=True) == 1

    def lapse(self, *, now: datetime | None = None) -> tuple[int, int]:
        """What has lapsed by ``now`` ends without an operator: each pause past its time
        ends (as ``resume``), each rate override past its time is cleared. (pauses
        ended, entries whose expiry restarted)."""
        now = now or utcnow()
        released = 0
        with self.db.transaction() as tx:
            queue_turn(tx)
            lapsed = tx.fetchall(Q.pauses_lapsed, {"now": now})
            for row in lapsed:
                tx.execute(Q.destination_resume, {"key": row["key"], "now": now})
                released += tx.execute(Q.restart_expiry, {"key": row["key"], "now": now})
            tx.execute(Q.rates_lapsed, {"now": now})
        return len(lapsed), released

    def entries(self, key: str) -> dict[str, int]:
        """How many of ``key``'s entries are ``pending`` and ``in_flight`` now, and how
        many its disable failed (``failedDisabled``: an enable leaves them to a redrive)."""
        with self.db.transaction() as tx:
            found = {row["status"]: int(row["n"]) for row in tx.fetchall(
                Q.destination_entries, {"key": key})}
            failed = tx.fetchone(Q.destination_failed_disabled, {"key": key})
        return {"pending": found.get("pending", 0), "inFlight": found.get("in_flight", 0),
                "failedDisabled": int(failed["n"]) if failed else 0}


__all__ = ["Control", "Destinations", "FailingDestination", "Stop", "Streak", "check_key",
           "stop_of"]
