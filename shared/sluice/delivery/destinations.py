"""Destinations that are down: a webhook host, a chat API, an SMTP server.

A destination is failing from its first transient failure (not connected, a 5xx, a 429,
credentials refused) until its next success. While it fails its entries wait in
``pending`` without counting attempts (``held_by`` names it) and out of the claim's
index; the claim takes one of them as its probe at each step (``Policy.probe_wait``: the
retry schedule's 5 s, 25 s, 2 min, 10 min, then every 10 min, or the provider's honoured
wait when longer); they expire as usual. Its next success unholds them all at once. It is *reported* (run summary, ``/api/queue/status``, the console, the
``DeliveryDestinationsDown`` metric and its alarm) once ``threshold`` probes in a row
failed, so one blip does not page anyone. A destination's failures are kept across runs,
so a low-volume destination (one alert an hour) is recognised as down as surely as a
busy one.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, NamedTuple

from sluice.core.times import iso_z_or_none
from sluice.delivery.policy import DELIVERY_POLICY, Policy
from sluice.store.db import Database, Row, load_queries, utcnow

Q = load_queries("delivery")


def _time(value: Any) -> datetime:
    if isinstance(value, str):  # SQLite's RETURNING hands back stored text
        return datetime.fromisoformat(value).astimezone(UTC)
    assert isinstance(value, datetime)
    return value


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


class Destinations:
    def __init__(self, db: Database, threshold: int, policy: Policy = DELIVERY_POLICY) -> None:
        self.db = db
        self.threshold = threshold
        self.policy = policy

    def load(self) -> dict[str, FailingDestination]:
        with self.db.transaction() as tx:
            return {row["key"]: FailingDestination.from_row(row)
                    for row in tx.fetchall(Q.destinations_all)}

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
        with self.db.transaction() as tx:
            tx.execute(Q.unhold, {"key": key, "now": now or utcnow()})
            tx.execute(Q.destination_up, {"key": key}, final=True)

    def reported(self, destination: FailingDestination) -> bool:
        return destination.failures >= self.threshold

    def status(self) -> list[dict[str, Any]]:
        """Every destination known to be failing, with how many entries wait on it."""
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.destinations_all)
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
