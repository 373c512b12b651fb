"""Destinations that are down: a webhook host, a chat API, an SMTP server.

A destination is down from its first transient failure (not connected, a 5xx, a 429,
credentials refused) until its next success. While it is down its entries wait in
``pending`` without counting attempts (``held_by`` names it), and one of them probes it
at each step of the retry schedule (5 s, 25 s, 2 min, 10 min, then every 10 min); they
expire as usual. It is *reported* (run summary, ``/api/queue/status``, the console, the
``DeliveryDestinationsDown`` metric and its alarm) once ``threshold`` probes in a row
failed, so one blip does not page anyone. A destination's failures are kept across runs,
so a low-volume destination (one alert an hour) is recognised as down as surely as a
busy one.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sluice.core.times import iso_z_or_none
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
    def __init__(self, db: Database, delays_s: tuple[float, ...], threshold: int) -> None:
        self.db = db
        self.delays_s = delays_s
        self.threshold = threshold

    def load(self) -> dict[str, FailingDestination]:
        with self.db.transaction() as tx:
            return {row["key"]: FailingDestination.from_row(row)
                    for row in tx.fetchall(Q.destinations_all)}

    def probe_delay(self, failures: int) -> timedelta:
        """The wait after ``failures`` failed probes in a row (the schedule, capped)."""
        return timedelta(seconds=self.delays_s[min(max(failures, 1), len(self.delays_s)) - 1])

    def failed(self, key: str, error: str, *, known: FailingDestination | None,
               retry_after_s: float | None = None, now: datetime | None = None) -> FailingDestination:
        """One more transient failure of ``key``: the next probe is one schedule step later
        (or when the destination asked, if later, within the schedule's cap)."""
        now = now or utcnow()
        failures = (known.failures if known else 0) + 1
        wait = self.probe_delay(failures)
        if retry_after_s is not None:
            wait = max(wait, timedelta(seconds=min(retry_after_s, self.delays_s[-1])))
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.destination_failed, {
                "key": key, "now": now, "error": error[:500],
                "next_probe_at": now + wait}, final=True)
        assert row is not None
        return FailingDestination.from_row(row)

    def up(self, key: str) -> None:
        with self.db.transaction() as tx:
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
