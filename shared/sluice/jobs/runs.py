"""Persistence for the cron contract: job runs, single-flight leases, the admin audit trail."""

from __future__ import annotations

import os
import socket
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sluice.core.errors import LeaseLost
from sluice.jobs.registry import JOBS, UNFENCED, FenceParams, Trigger
from sluice.store.db import Database, Row, Tx, load_queries, utcnow
from sluice.store.history import Sample, add_samples

Q = load_queries("runs")


def storable(value: Any) -> Any:
    """``value`` with every string safe for a ``text`` / ``jsonb`` column (no NUL, no lone
    surrogate): an audit row must be writable whatever the caller sent."""
    if isinstance(value, str):
        return value.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode()
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v) for v in value]
    return value


def lease_holder_id() -> str:
    """``host:pid:nonce``: lets a run on the same host see that a holder's process is gone."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


# Holders of this process whose run ended without releasing its lease (the store was gone
# at the end): the next run in the same process (a warm Lambda sandbox) may take the lease
# over at once instead of waiting for it to expire. Bounded: only the latest are kept.
_ENDED_UNRELEASED: deque[str] = deque(maxlen=64)


def ended_without_release(holder: str) -> None:
    """Record that this process's run ``holder`` is over although its lease was not released."""
    _ENDED_UNRELEASED.append(holder)


def _holder_is_dead(holder: str) -> bool:
    if holder in _ENDED_UNRELEASED:
        return True
    host, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False  # another machine (or Lambda sandbox): only the lease's expiry can tell
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Fence:
    """Proof, inside a transaction, that this run still holds its job's lease.

    A drain calls ``check(tx)`` in the transaction that precedes each side effect
    (claiming what it will send) and in the one that settles it: a run that lost its
    lease (hung past it, and another run took the job over) raises ``LeaseLost`` and
    the transaction rolls back, so it never settles over the new holder's work. On
    Postgres the lease row is share-locked until the transaction ends, so a takeover
    cannot slip in between the check and the commit.
    """

    __slots__ = ("holder", "job")

    def __init__(self, job: str | None = None, holder: str | None = None) -> None:
        self.job = job
        self.holder = holder

    def check(self, tx: Tx) -> None:
        if self.job is None:  # not run under a lease (a direct call)
            return
        row = tx.fetchone(Q.lease_is_mine, {"job": self.job, "holder": self.holder,
                                            "now": utcnow()})
        if row is None:
            raise self._lost()

    def bind(self, tx: Tx) -> FenceParams:
        """Parameters for a statement that checks the lease itself, in the same round trip
        as its side effect: ``fence_job``, ``fence_holder``, ``fence_now``, read by a
        ``lease`` CTE (``lease_is_mine`` with its share lock) whose verdict the statement
        returns as ``lease_held`` for ``confirm``; ``fence_job`` NULL means unfenced.
        On SQLite, where a statement cannot both write and report, the check runs here as
        its own statement (in process, under the transaction's write lock) and the
        statement's own check is left out."""
        if self.job is None:
            return UNFENCED
        if tx.dialect == "sqlite":
            self.check(tx)
            return UNFENCED
        return {"fence_job": self.job, "fence_holder": self.holder, "fence_now": utcnow()}

    def confirm(self, rows: list[dict[str, Any]]) -> None:
        """Raise ``LeaseLost`` if a fenced statement's rows say the lease was not held (the
        statement then changed nothing)."""
        if any(not row["lease_held"] for row in rows):
            raise self._lost()

    def _lost(self) -> LeaseLost:
        return LeaseLost(f"{self.job}: this run's lease lapsed or was taken over", job=self.job)


NO_FENCE = Fence()

ALREADY_RUNNING = {"skipped": "already_running"}

ABANDONED = {"error": {"code": "abandoned",
                       "message": "the run never finished (killed, or hung past its lease); "
                                  "a later run took the job over"}}


class RunStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # Each step below exists as a method of one transaction (for tests and tools) and is
    # combined by ``begin`` / ``end``: a run's bookkeeping is two transactions, an
    # ``already_running`` answer one.

    def begin(self, job: str, holder: str, ttl: timedelta, trigger: Trigger, request_id: str,
              started_at: datetime) -> str | None:
        """In one transaction: take the job's lease and record the run as ``running`` (the
        run id), or, when another run holds the lease, record this one ``skipped`` with
        ``result`` ``already_running`` (None)."""
        with self.db.transaction() as tx:
            if not _acquire(tx, job, holder, ttl):
                _record(tx, job, trigger, request_id, "skipped", ALREADY_RUNNING)
                return None
            return _start(tx, job, trigger, request_id, started_at)

    def end(self, run_id: str, outcome: str, result: dict[str, Any], started_at: datetime,
            job: str, holder: str, samples: Sequence[Sample] = ()) -> None:
        """In one transaction: record the run's outcome, release its lease and add its
        history ``samples``."""
        with self.db.transaction() as tx:
            _finish(tx, run_id, outcome, result, started_at)
            tx.write(Q.release_lease, {"job": job, "holder": holder})
            add_samples(tx, samples)

    def acquire_lease(self, job: str, holder: str, ttl: timedelta) -> bool:
        """Take the job's lease if it is free, expired, or held by a dead process on this host."""
        with self.db.transaction() as tx:
            return _acquire(tx, job, holder, ttl)

    def lease(self, job: str) -> Row | None:
        """The lease of ``job`` as stored (``holder``, ``expires_at``), if any: held while a
        run of it is running, and past its expiry when a run never finished."""
        with self.db.transaction() as tx:
            return tx.fetchone(Q.lease_holder, {"job": job})

    def release_lease(self, job: str, holder: str) -> None:
        with self.db.transaction() as tx:
            tx.execute(Q.release_lease, {"job": job, "holder": holder})

    def start(self, job: str, trigger: Trigger, request_id: str, started_at: datetime) -> str:
        """Record a run as ``running``; called with the lease held, so any other run of the
        job still ``running`` is over and is marked ``error`` (code ``abandoned``)."""
        with self.db.transaction() as tx:
            return _start(tx, job, trigger, request_id, started_at)

    def finish(self, run_id: str, outcome: str, result: dict[str, Any], started_at: datetime,
               ) -> None:
        with self.db.transaction() as tx:
            _finish(tx, run_id, outcome, result, started_at)

    def record_skipped(self, job: str, trigger: Trigger, request_id: str,
                       result: dict[str, Any]) -> None:
        with self.db.transaction() as tx:
            _record(tx, job, trigger, request_id, "skipped", result)

    def last_runs(self, jobs: Iterable[str] | None = None) -> dict[str, Row]:
        """The latest run of each of ``jobs`` (default: every registered job), by job."""
        names = list(JOBS if jobs is None else jobs)
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.last_runs, {"jobs": tx.json(names)}, final=True)
        return {row["job"]: row for row in rows}

    def by_request(self, job: str, request_id: str) -> Row | None:
        """The run of ``job`` recorded under ``request_id`` (a handed-off run's id)."""
        with self.db.transaction() as tx:
            return tx.fetchone(Q.run_by_request, {"job": job, "request_id": request_id})

    def last_scheduled_runs(self, jobs: Iterable[str], now: datetime) -> dict[str, datetime]:
        """When the scheduler (EventBridge or the cron GET) last started each of ``jobs``, no
        later than ``now``: a run recorded by a clock ahead of it is not taken as the newest."""
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.last_scheduled_runs,
                               {"jobs": tx.json(list(jobs)), "now": now}, final=True)
        return {row["job"]: row["started_at"] for row in rows if row["started_at"] is not None}

    def recent(self, job: str, limit: int = 20) -> list[Row]:
        with self.db.transaction() as tx:
            return tx.fetchall(Q.recent_runs, {"job": job, "limit": limit})

    def audit(self, *, actor: str, action: str, target: str | None, outcome: str,
              ip: str | None, detail: dict[str, Any] | None = None) -> str:
        """Write one audit row; returns its id (``complete_audit`` settles a ``started`` row)."""
        audit_id = str(uuid.uuid4())
        with self.db.transaction() as tx:
            tx.write(Q.audit, {
                "id": audit_id, "actor": storable(actor), "action": storable(action),
                "target": storable(target), "outcome": storable(outcome), "ip": storable(ip),
                "at": utcnow(),
                "detail": tx.json(storable(detail)) if detail is not None else None,
            })
        return audit_id

    def complete_audit(self, audit_id: str, outcome: str,
                       detail: dict[str, Any] | None = None, target: str | None = None) -> None:
        """Settle a row written with outcome ``started`` before its action ran (``target``
        when the action named it only as it ran, e.g. a created request's id)."""
        with self.db.transaction() as tx:
            tx.execute(Q.complete_audit, {
                "id": audit_id, "outcome": storable(outcome), "target": storable(target),
                "detail": tx.json(storable(detail)) if detail is not None else None,
            })

    def progress_audit(self, audit_id: str, detail: dict[str, Any], *,
                       tx: Tx | None = None) -> None:
        """What a row still ``started`` has done so far (its ``detail``), in ``tx`` when
        given, so that the action's write and what its row says of it commit together."""
        if tx is None:
            with self.db.transaction() as own:
                self.progress_audit(audit_id, detail, tx=own)
            return
        tx.execute(Q.progress_audit, {"id": audit_id, "detail": tx.json(storable(detail))})

    def discard_audit(self, audit_id: str) -> None:
        """Drop a row still ``started``: its request turned out to be a preview."""
        with self.db.transaction() as tx:
            tx.execute(Q.discard_audit, {"id": audit_id})

    def recent_audit(self, limit: int = 50) -> list[Row]:
        with self.db.transaction() as tx:
            return tx.fetchall(Q.recent_audit, {"limit": limit})


def _acquire(tx: Tx, job: str, holder: str, ttl: timedelta) -> bool:
    now = utcnow()
    params = {"job": job, "holder": holder, "now": now, "expires_at": now + ttl}
    row = tx.fetchone(Q.acquire_lease, params)
    if row is not None:
        return bool(row["holder"] == holder)
    current = tx.fetchone(Q.lease_holder, {"job": job})
    if current is None or not _holder_is_dead(current["holder"]):
        return False
    return tx.execute(Q.take_over_lease, {**params, "previous": current["holder"]}) == 1


def _start(tx: Tx, job: str, trigger: Trigger, request_id: str, started_at: datetime) -> str:
    run_id = str(uuid.uuid4())
    tx.write(Q.abandon_running, {"job": job, "now": utcnow(), "result": tx.json(ABANDONED)})
    tx.write(Q.start_run, {"id": run_id, "job": job, "trigger": trigger,
                             "request_id": request_id, "started_at": started_at,
                             "outcome": "running"})
    return run_id


def _finish(tx: Tx, run_id: str, outcome: str, result: dict[str, Any], started_at: datetime,
            ) -> None:
    finished = utcnow()
    tx.write(Q.finish_run, {
        "id": run_id, "finished_at": finished, "outcome": outcome,
        "duration_ms": int((finished - started_at).total_seconds() * 1000),
        "result": tx.json(result),
    })


def _record(tx: Tx, job: str, trigger: Trigger, request_id: str, outcome: str,
            result: dict[str, Any]) -> None:
    now = utcnow()
    tx.write(Q.record_run, {
        "id": str(uuid.uuid4()), "job": job, "trigger": trigger, "request_id": request_id,
        "started_at": now, "finished_at": now, "duration_ms": 0, "outcome": outcome,
        "result": tx.json(result),
    })
