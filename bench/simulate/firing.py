"""When the scheduled jobs fire: ``serverless.yml``'s schedules on a fixed grid (a rate
counts from the start of the run, a cron is a cron), each firing taken only when the job
can do something, decided by an exact and cheap check:

- ``delivery-drain``: a pending entry that waits on nothing comes due, a pending entry
  reaches its expiry, an in-flight lease lapses, a failing destination's probe comes due
  or a pause ends (one read of ``delivery_queue`` and ``delivery_destinations``; rate
  limits set their entries' ``next_attempt_at``, so they are covered; an entry held for
  its destination is not due by its own ``next_attempt_at``: seed 29 woke the drain every
  minute for a day on one held for a dead destination, 1,250 idle runs);
- ``metering-flush``: its outbox holds a row it may send (pending, or failed with
  attempts left);
- ``ledger-redrive``: the Redis retry queue (or its processing list) holds an entry;
- ``erasure-purge``: a request's grace window ends, or a purge's sweep is pending;
- ``rss-refresh``: a failing source's backoff ends, or a feed answers differently from
  what its source last fetched (a story published, a fault window beginning or ending: the
  world knows these moments), or an alert rule was edited;
- any job whose last run crashed or did not end ``ok``: its next firing;
- otherwise one firing per ``IDLE_EVERY``: the idle run records itself, ``history-sample``
  takes its depth sample, and housekeeping with no outward effect (the drain's prune of
  settled entries past their retention, the sweep's effect-record touch and prune) is
  done then.

Work waiting is never held back: a firing the check finds work for is the first grid
point at or after the moment the work appears (after the run that made it, at the same
instant). ``state-cleanup`` (a daily cron) fires every time. Coalesced firings (grid points
not run) are counted per job. The checks read the store and the world; they never change
either, so a coalesced firing is exactly a firing that would have found nothing to do.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.jobs.schedule import Schedule
from sluice.store.db import Queries

if TYPE_CHECKING:
    from bench.simulate.peers import Feed
    from sluice.store.db import Database

Q = Queries.parse((Path(__file__).parent / "wake.sql").read_text())

IDLE_EVERY = timedelta(hours=24)
GATED = ("delivery-drain", "rss-refresh", "history-sample", "metering-flush",
         "ledger-redrive", "erasure-purge")
TICK = timedelta(microseconds=1)  # "strictly after" for a comparison with <


class Firing:
    """One job's schedule: its grid, its queued firing, its last run."""

    def __init__(self, job: str, schedule: Schedule, start: datetime) -> None:
        self.job, self.schedule, self.start = job, schedule, start
        self.gated = job in GATED and schedule.interval is not None
        self.queued: datetime | None = None
        self.token = 0
        self.last = start
        self.fired = 0
        self.again = False  # the last run crashed or did not end ok

    def ceil(self, moment: datetime) -> datetime:
        """The first firing at or after ``moment`` (never the start itself)."""
        interval = self.schedule.interval
        if interval is None:
            return self.schedule.next_after(moment - TICK)
        steps = max(1, -(-(moment - self.start) // interval))
        return self.start + steps * interval

    def after(self, moment: datetime) -> datetime:
        """The first firing strictly after ``moment``."""
        return self.ceil(moment + TICK)

    def grid_count(self, end: datetime) -> int:
        """How many firings the schedule has in (start, end]."""
        interval = self.schedule.interval
        return (end - self.start) // interval if interval is not None else self.fired


def _time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def drain_wake(db: Database, expire: timedelta) -> datetime | None:
    """When the delivery drain next finds something to do (None: nothing is queued)."""
    with db.transaction() as tx:
        row = tx.fetchone(Q.drain_wake, {}, final=True)
    if row is None:
        return None
    due, oldest, lease = (_time(row["due"]), _time(row["oldest"]),
                          _time(row["lease_end"]))
    moments = [m for m in (due, _time(row["probe"]), _time(row["pause_end"])) if m]
    if oldest is not None:  # expired when enqueued_at < now - expire
        moments.append(oldest + expire + TICK)
    if lease is not None:  # recovered when its lease end < now
        moments.append(lease + TICK)
    return min(moments, default=None)


def tick_wake(db: Database, feeds: dict[str, Feed], start: datetime) -> datetime | None:
    """When the rss tick next fetches something new: per source of ``feeds`` (by URL), its
    backoff's end when it is failing, else its feed's first change since it was last
    fetched."""
    moments = []
    with db.transaction() as tx:
        rows = tx.fetchall(Q.tick_sources, {}, final=True)
    for row in rows:
        feed = feeds.get(row["url"])
        if feed is None:
            continue
        backoff = _time(row["next_attempt_at"])
        if backoff is not None:
            moments.append(backoff)
            continue
        fetched = _time(row["last_fetched_at"])
        change = feed.next_change(fetched if fetched is not None else start - TICK)
        if change is not None:
            moments.append(change)
    return min(moments, default=None)


def outbox_waiting(db: Database) -> bool:
    from sluice.billing.metering import OutboxStore

    return OutboxStore(db).eligible_count() > 0


def retry_waiting(redis: Any) -> bool:
    from sluice.store.redis_clients import LEDGER_RETRY_PROCESSING, LEDGER_RETRY_QUEUE

    return bool(redis.llen(LEDGER_RETRY_QUEUE) or redis.llen(LEDGER_RETRY_PROCESSING))


def erasure_wake(db: Database) -> datetime | None:
    """When erasure-purge next has something to do: a grace window ends, or a purge's sweep
    of the external stores is still pending (now)."""
    with db.transaction() as tx:
        row = tx.fetchone(Q.erasure_wake, {}, final=True)
    if row is None:
        return None
    if row["sweeps"]:
        return datetime.min.replace(tzinfo=UTC)
    return _time(row["due"])
