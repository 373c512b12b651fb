"""Destinations: a webhook's host and port, a Telegram chat, a Slack channel, the SMTP server.

A destination's key is its adapter's ``outage_key``; the drain writes it on each entry it
takes (``delivery_queue.destination``), and ``delivery_destinations`` holds what Sluice
knows of it. A webhook's is ``webhook:<host>:<port>`` in one form however its URL writes
the receiver (``webhook_receiver``: the port always written out), and a key an operator
types is read into that form (``check_key``). Its state, read by the drain and shown by ``view``:

- *failing* from its first transient failure (not connected, a 5xx, a 429, credentials
  refused) until its next success. Its entries wait in ``pending`` without counting
  attempts (``held_by`` names it) and out of the claim's index; the claim takes one of them
  as its probe at each step (``Policy.probe_wait``: the retry schedule's 5 s, 25 s, 2 min,
  10 min, then every 10 min, or the provider's honoured wait when longer); they expire as
  usual. Its next success unholds them all at once. It is *reported* (run summary,
  ``/api/queue/status``, the console, the ``DeliveryDestinationsDown`` metric and its
  alarm) once ``threshold`` probes in a row failed, so one blip does not page anyone. A
  destination's failures are kept across runs, so a low-volume destination (one alert an
  hour) is recognised as down as surely as a busy one.
- *paused* until a time by an operator: its entries wait out of the claim's index, nothing
  counted, nothing expires; at the pause's end (``lapse``, each drain) they are due at
  once, their expiry read from then.
- *disabled* (a ``410 Gone``, a chat that blocked or removed the bot, days failing without a
  success, or an operator): its entries fail ``destination_disabled`` at once, attempts
  untouched, no request made; it is never probed. Enabled again, it starts afresh, and
  its failed entries are redriven (or sent again) by an operator.
- *ok* otherwise.

An operator may also override its rate until a time (``sluice.delivery.ratelimit`` reads
the overrides in force). What each state means for an entry is the policy's
(``sluice.delivery.policy``); this module keeps the states and moves the entries as it
says.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, NamedTuple

from sluice.core.errors import RequestError
from sluice.core.times import iso_z_or_none
from sluice.delivery.policy import DELIVERY_POLICY, Policy
from sluice.egress.errors import DestinationRefused
from sluice.egress.urls import receiver
from sluice.store.db import Database, Row, Tx, load_queries, utcnow

Q = load_queries("delivery")

MAX_KEY_LENGTH = 512


def _time(value: Any) -> datetime:
    if isinstance(value, str):  # SQLite's RETURNING hands back stored text
        return datetime.fromisoformat(value).astimezone(UTC)
    assert isinstance(value, datetime)
    return value


def _time_or_none(value: Any) -> datetime | None:
    return None if value is None else _time(value)


def webhook_receiver(url: str) -> str | None:
    """``<host>:<port>`` of the receiver a webhook URL reaches (``receiver``: lower case,
    IDNA, no trailing dot, the scheme's default port written out), the one name its
    destination key and its rate key use; None when the URL cannot be parsed."""
    try:
        host, port = receiver(url)
    except DestinationRefused:
        return None
    return f"{host}:{port}"


def check_key(key: str) -> str:
    """A destination key as an operator gives it (``webhook:hooks.example.com:443``,
    ``telegram:1001``): printable, bounded; 400 naming ``destination`` otherwise. A
    webhook's is read into the form the drain gives it (host in lower case, IDNA, no
    trailing dot); one without its port (``webhook:hooks.example.com:``, the form before
    the port was always written) is refused, naming the keys it may mean."""
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH or not key.isprintable():
        raise RequestError(f"a destination is its key (such as telegram:1001 or "
                           f"webhook:hooks.example.com:443), 1 to {MAX_KEY_LENGTH} printable "
                           "characters", field="destination")
    channel, _, rest = key.partition(":")
    return _webhook_key(rest) if channel == "webhook" and rest else key


def _webhook_key(rest: str) -> str:
    host, colon, port = rest.rpartition(":")
    if host == "invalid":  # an entry whose URL does not parse: its own key, as given
        return f"webhook:{rest}"
    if not colon or not host:
        raise RequestError(f"a webhook destination is webhook:<host>:<port>, such as "
                           f"webhook:{rest}:443", field="destination")
    if not port:
        raise RequestError(f"webhook:{rest} names no port: a webhook destination's key "
                           f"always names it, webhook:{host}:443 for https or "
                           f"webhook:{host}:80 for http", field="destination")
    if not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise RequestError(f"webhook:{rest}: the port must be a number from 1 to 65535",
                           field="destination")
    # read as the drain reads a URL (``webhook_receiver``), so the two never disagree
    found = webhook_receiver(f"https://{f'[{host}]' if ':' in host else host}:{int(port)}/")
    # None: no URL names it so: matches nothing, refused by nothing
    return f"webhook:{found}" if found else f"webhook:{rest}"


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

    @classmethod
    def from_row(cls, row: Row) -> Control:
        return cls(row["key"], _time_or_none(row["paused_until"]),
                   _time_or_none(row["disabled_at"]), row["disabled_reason"])


class Destinations:
    def __init__(self, db: Database, threshold: int, policy: Policy = DELIVERY_POLICY) -> None:
        self.db = db
        self.threshold = threshold
        self.policy = policy

    # --- failing --------------------------------------------------------------------

    def load(self) -> dict[str, FailingDestination]:
        """The destinations failing now (a disabled one is not probed, so not among them)."""
        with self.db.transaction() as tx:
            return {row["key"]: FailingDestination.from_row(row)
                    for row in tx.fetchall(Q.destinations_failing)}

    def failed(self, key: str, error: str, *, known: FailingDestination | None,
               asked_s: float | None = None, alike: tuple[str, str] | None = None,
               now: datetime | None = None) -> tuple[FailingDestination, int]:
        """One more failed probe of ``key``: the next one when the policy says. The pending
        entries ``alike`` (channel, recipient) are held on it at once, in the same
        transaction, so a backlog is not claimed an entry at a time to learn it. The
        destination, and how many entries it newly holds so."""
        now = now or utcnow()
        wait = self.policy.probe_wait((known.failures if known else 0) + 1, asked_s)
        held = 0
        with self.db.transaction() as tx:
            if alike is not None:
                held = tx.execute(Q.hold_alike, {"key": key, "channel": alike[0], "now": now,
                                          "recipient": alike[1],
                                          "error": f"waiting: {key} is failing; last: "
                                                   f"{error[:400]}"})
            row = tx.fetchone(Q.destination_failed, {
                "key": key, "now": now, "error": error[:500],
                "next_probe_at": now + wait}, final=True)
        assert row is not None
        return FailingDestination.from_row(row), held

    def up(self, key: str, *, now: datetime | None = None) -> None:
        """``key`` took an entry: what it held is due at once."""
        now = now or utcnow()
        with self.db.transaction() as tx:
            tx.execute(Q.unhold, {"key": key, "now": now})
            tx.execute(Q.destination_up, {"key": key, "now": now}, final=True)

    def reported(self, destination: FailingDestination) -> bool:
        return destination.failures >= self.threshold

    def status(self) -> list[dict[str, Any]]:
        """Every destination known to be failing, with how many entries wait on it."""
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.destinations_failing)
            waiting = {row["held_by"]: int(row["n"]) for row in tx.fetchall(Q.held_counts)}
        out = []
        for row in rows:
            found = FailingDestination.from_row(row)
            out.append({"key": found.key, "down": self.reported(found),
                        "downSince": iso_z_or_none(found.down_since),
                        "failures": found.failures, "waiting": waiting.get(found.key, 0),
                        "nextProbeAt": iso_z_or_none(found.next_probe_at),
                        "lastError": found.last_error})
        return out

    # --- what stops sends -------------------------------------------------------------

    def controls(self, *, now: datetime | None = None) -> dict[str, Control]:
        """The destinations disabled, or paused now."""
        with self.db.transaction() as tx:
            return {row["key"]: Control.from_row(row) for row in tx.fetchall(
                Q.destination_controls, {"now": now or utcnow()})}

    def control(self, key: str, *, now: datetime | None = None) -> Control | None:
        """``controls`` for one destination (the inline path reads only its own)."""
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.destination_get, {"key": key})
        if row is None:
            return None
        found = Control.from_row(row)
        return found if found.disabled_at is not None or found.paused(now or utcnow()) else None

    def disable(self, key: str, reason: str, *, now: datetime | None = None) -> int:
        """Disable ``key`` (a destination disabled already keeps its first reason): its
        pending entries fail ``destination_disabled`` in the same transaction, attempts
        untouched. How many entries failed so."""
        now = now or utcnow()
        with self.db.transaction() as tx:
            tx.execute(Q.destination_disable, {"key": key, "now": now, "reason": reason[:500]})
            return tx.execute(Q.fail_destination, {"key": key, "now": now,
                                                   "reason": reason[:500]}, final=True)

    def enable(self, key: str, *, now: datetime | None = None) -> bool:
        """Enable ``key`` afresh (no failures counted); False when it was not disabled."""
        with self.db.transaction() as tx:
            return tx.execute(Q.destination_enable, {"key": key, "now": now or utcnow()},
                              final=True) == 1

    def pause(self, key: str, until: datetime, *, now: datetime | None = None) -> int:
        """Pause ``key`` until ``until``: its pending entries wait held on it. How many."""
        now = now or utcnow()
        with self.db.transaction() as tx:
            tx.execute(Q.destination_pause, {"key": key, "until": until, "now": now})
            return tx.execute(Q.hold_destination, {"key": key, "now": now, "until_at": until,
                                                   "until": iso_z_or_none(until)}, final=True)

    def resume(self, key: str, *, now: datetime | None = None) -> int:
        """End ``key``'s pause now: its entries are due at once (held still for the probe if
        it is failing), their expiry read from now. How many entries it released."""
        now = now or utcnow()
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.destination_resume, {"key": key, "now": now})
            if row is None:
                return 0
            return self._release(tx, key, failing=row["down_since"] is not None, now=now)

    def _release(self, tx: Tx, key: str, *, failing: bool, now: datetime) -> int:
        return tx.execute(Q.release_destination, {"key": key, "now": now,
                                                  "failing": int(failing)})

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
        releases its entries (as ``resume``), each rate override past its time is cleared.
        (pauses ended, entries released)."""
        now = now or utcnow()
        released = 0
        with self.db.transaction() as tx:
            lapsed = tx.fetchall(Q.pauses_lapsed, {"now": now})
            for row in lapsed:
                tx.execute(Q.destination_resume, {"key": row["key"], "now": now})
                released += self._release(tx, row["key"], failing=row["down_since"] is not None,
                                          now=now)
            tx.execute(Q.rates_lapsed, {"now": now})
        return len(lapsed), released

    def entries(self, key: str) -> dict[str, int]:
        """How many of ``key``'s entries are ``pending`` and ``in_flight`` now (an operator's
        change moves the pending ones; those in flight settle as their send ends), and how
        many its disable failed (``failedDisabled``: an enable leaves them to a redrive)."""
        with self.db.transaction() as tx:
            found = {row["status"]: int(row["n"]) for row in tx.fetchall(
                Q.destination_entries, {"key": key})}
            failed = tx.fetchone(Q.destination_failed_disabled, {"key": key})
        return {"pending": found.get("pending", 0), "inFlight": found.get("in_flight", 0),
                "failedDisabled": int(failed["n"]) if failed else 0}


__all__ = ["Control", "Destinations", "FailingDestination", "check_key", "webhook_receiver"]
