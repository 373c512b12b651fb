"""The job lease against a model: acquire, release, expiry, a holder that died on this
host, and the fence, in any order on the real store; at most one holder at a time, and
the fence admits exactly the current, unexpired holder."""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass
from datetime import timedelta

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sluice.core.errors import LeaseLost
from sluice.jobs.runs import Fence, RunStore
from sluice.store.db import Database, utcnow
from tests.model import run_model

JOB = "state-cleanup"
TTL = timedelta(seconds=60)
LIVE = ["far-host:101:a", "far-host:202:b"]  # another machine: only expiry frees its lease


def dead_local_holder() -> str:
    """A holder id of a process on this host that has exited."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return f"{socket.gethostname()}:{proc.pid}:dead"


@dataclass
class Held:
    holder: str
    expired: bool = False


def machine_for(db: Database, dead: str) -> type[RuleBasedStateMachine]:
    class LeaseModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            with db.transaction() as tx:
                tx.execute("DELETE FROM job_leases")
            self.runs = RunStore(db)
            self.lease: Held | None = None

        def _free(self) -> bool:
            return self.lease is None or self.lease.expired or self.lease.holder == dead

        @rule(holder=st.sampled_from(LIVE))
        def acquire(self, holder: str) -> None:
            expected = self._free()
            assert self.runs.acquire_lease(JOB, holder, TTL) == expected
            if expected:
                self.lease = Held(holder)

        @rule(holder=st.sampled_from(LIVE))
        def release(self, holder: str) -> None:
            self.runs.release_lease(JOB, holder)
            if self.lease is not None and self.lease.holder == holder:
                self.lease = None

        @rule()
        def lease_lapses(self) -> None:
            with db.transaction() as tx:
                tx.execute("UPDATE job_leases SET expires_at = :past",
                           {"past": utcnow() - timedelta(hours=1)})
            if self.lease is not None:
                self.lease.expired = True

        @rule()
        def holder_dies_on_this_host(self) -> None:
            """A run on this host took the lease and was killed."""
            with db.transaction() as tx:
                tx.execute("DELETE FROM job_leases")
                tx.execute("INSERT INTO job_leases (job, holder, acquired_at, expires_at) "
                           "VALUES (:job, :holder, :now, :until)",
                           {"job": JOB, "holder": dead, "now": utcnow(),
                            "until": utcnow() + TTL})
            self.lease = Held(dead)

        @rule(holder=st.sampled_from(LIVE))
        def fence(self, holder: str) -> None:
            mine = (self.lease is not None and self.lease.holder == holder
                    and not self.lease.expired)
            with db.transaction() as tx:
                if mine:
                    Fence(JOB, holder).check(tx)
                else:
                    with pytest.raises(LeaseLost):
                        Fence(JOB, holder).check(tx)

        @invariant()
        def one_holder_as_modelled(self) -> None:
            with db.transaction() as tx:
                rows = tx.fetchall("SELECT holder, expires_at FROM job_leases WHERE job = :job",
                                   {"job": JOB})
            if self.lease is None:
                assert rows == []
                return
            [row] = rows
            assert row["holder"] == self.lease.holder
            assert (row["expires_at"] < utcnow()) == self.lease.expired

    return LeaseModel


def test_the_job_lease_behaves_like_its_model(db: Database) -> None:
    run_model(machine_for(db, dead_local_holder()))
