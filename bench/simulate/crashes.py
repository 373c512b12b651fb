"""Crashes at Sluice's named crash points, in process.

``sluice.core.crash.crash_point`` exits the process when ``SLUICE_CRASH_AT`` names the
point (the kill sweep uses that). Here each module's ``crash_point`` is replaced while the
simulation runs: an armed point raises ``SimCrash``, which no ``except Exception`` in
Sluice catches, so the run stops there with its claims, leases and rows as they were,
like a killed Lambda. (Unlike a kill, ``finally`` blocks still run: the job's lease is
released rather than left to lapse.)

A crash may be *targeted* (``point@channel:recipient``): armed, it waits, for at most
``TARGET_FOR``, for the point to be reached right after a request to that destination (as
the peers recorded it: ``target_ok``), so that crashes armed one after another fall on
the same entry (its lease lapsing again and again after its message left).

Two more kinds of armed point, each a job's world rather than a kill: ``error:<point>``
raises ``SimJobError``, an ordinary exception (a dependency of the job failing in a way
it does not expect), which the job runner turns into an ``error`` run; ``dup:<point>``
calls ``on_duplicate`` the ``DUPLICATE_AT``-th time the point is reached after it is
armed, while the run is alive and has been for a while (a drain waiting its rate slots):
EventBridge invoking the job's function a second time for one schedule (it delivers at
least once).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from bench.chaos.points import discover

TARGET_FOR = timedelta(hours=2)
DUPLICATE_AT = 3


class SimCrash(BaseException):
    def __init__(self, point: str) -> None:
        super().__init__(point)
        self.point = point


class SimJobError(Exception):
    def __init__(self, point: str) -> None:
        super().__init__(f"simulated: a dependency of the job failed at {point}")
        self.point = point


class Crashes:
    def __init__(self, rng: random.Random, start: datetime, end: datetime,
                 faults: dict[str, int], per_month: float = 4.0) -> None:
        self.points = sorted(discover())
        span_days = (end - start).total_seconds() / 86400
        count = int(per_month * span_days / 30)
        self.plan = sorted((start + timedelta(days=rng.uniform(0, span_days)),
                            rng.choice(self.points)) for _ in range(count))
        self.armed: str | None = None
        self.armed_error: str | None = None
        self.armed_duplicate: str | None = None
        self.duplicate_in = 0  # reaches of the armed point before the duplicate comes
        self.on_duplicate: Callable[[str], None] = lambda point: None
        self.faults = faults
        self.hit: list[str] = []
        self.on_crash: Callable[[str], None] = lambda point: None
        self.on_point: Callable[[str], None] = lambda point: None  # every point reached
        # every point the code goes on from (no crash, no error raised there)
        self.passed: Callable[[str], None] = lambda point: None
        self.targeted: list[tuple[str, str, datetime]] = []  # (point, destination, until)
        self.target_ok: Callable[[str], bool] = lambda destination: False
        self.now: Callable[[], datetime] = lambda: start

    def arm(self, point: str) -> None:
        kind, _, rest = point.partition(":")
        if kind == "error" and rest:
            self.armed_error = rest
            return
        if kind == "dup" and rest:
            self.armed_duplicate, self.duplicate_in = rest, DUPLICATE_AT
            return
        if "@" in point:
            name, destination = point.split("@", 1)
            self.targeted.append((name, destination, self.now() + TARGET_FOR))
            return
        self.armed = point

    def _crash_point(self, name: str) -> None:
        self.on_point(name)
        if name == self.armed:
            self.armed = None
            self._crash(name)
        if name == self.armed_duplicate:
            self.duplicate_in -= 1
        if name == self.armed_duplicate and not self.duplicate_in:
            self.armed_duplicate = None
            self.faults["duplicate_invocation"] = self.faults.get("duplicate_invocation", 0) + 1
            self.on_duplicate(name)
        if name == self.armed_error:
            self.armed_error = None
            self.hit.append(name)
            self.faults["job_error"] = self.faults.get("job_error", 0) + 1
            self.on_crash(name)  # to the invariants, like a crash there (its claim lapses)
            raise SimJobError(name)
        if self.targeted:
            now = self.now()
            self.targeted = [t for t in self.targeted if t[2] > now]
            # the first armed at this point for the destination the code holds now (crashes
            # targeted at different destinations do not wait for each other)
            hit = next((n for n, t in enumerate(self.targeted)
                        if t[0] == name and self.target_ok(t[1])), None)
            if hit is not None:
                self.targeted.pop(hit)
                self._crash(name)
        self.passed(name)

    def _crash(self, name: str) -> None:
        self.hit.append(name)
        self.faults["crash"] = self.faults.get("crash", 0) + 1
        self.on_crash(name)
        raise SimCrash(name)

    @contextmanager
    def installed(self) -> Iterator[None]:
        from sluice.core import crash

        original = crash.crash_point
        patched = [module for name, module in sorted(sys.modules.items())
                   if name.startswith("sluice.") and module is not None
                   and getattr(module, "crash_point", None) is original]
        for module in patched:
            module.crash_point = self._crash_point  # type: ignore[attr-defined]
        try:
            yield
        finally:
            for module in patched:
                module.crash_point = original  # type: ignore[attr-defined]
