"""The simulated clock: wall time, ``time.monotonic`` and ``time.sleep`` all read it.

Time moves only when the simulation moves it (to the next scheduled firing) or when the
code under test waits (``time.sleep``, a peer that answers after the timeout): work itself
costs no simulated time, so a simulated year costs only the work done in it.

``time-machine`` moves ``datetime.now`` and ``time.time`` (also in C extensions' callers);
``time.monotonic`` and ``time.sleep`` are replaced by functions of that clock. They must be
installed before Sluice is imported, because Sluice binds ``time.monotonic`` as a default
argument at import time (``Deadline``, ``run_job``): ``install()`` is the first thing the
command does.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any, Self

import time_machine

START = datetime(2026, 1, 5, 0, 0, tzinfo=UTC)  # a Monday: cron(… ? *) weekdays line up


class SimClock:
    def __init__(self, start: datetime = START) -> None:
        self.start = start
        self._travel: Any = None
        self._traveller: Any = None
        self._real_sleep = time.sleep
        self._real_monotonic = time.monotonic
        self.slept_s = 0.0

    def install(self) -> None:
        self._travel = time_machine.travel(self.start, tick=False)
        self._traveller = self._travel.start()
        time.monotonic = time.time
        time.sleep = self.sleep  # type: ignore[assignment]

    def reset(self) -> None:
        """Back to the start, for the next seed."""
        assert self._traveller is not None
        self._travel.stop()
        self._travel = time_machine.travel(self.start, tick=False)
        self._traveller = self._travel.start()
        self.slept_s = 0.0

    def uninstall(self) -> None:
        time.monotonic = self._real_monotonic
        time.sleep = self._real_sleep
        if self._traveller is not None:
            self._travel.stop()
            self._traveller = None

    def now(self) -> datetime:
        return datetime.now(UTC)

    def day(self) -> float:
        return (self.now() - self.start).total_seconds() / 86400

    def sleep(self, seconds: float) -> None:
        """A wait of the code under test: simulated time passes, no real time."""
        if seconds > 0:
            self.slept_s += seconds
            self.advance(timedelta(seconds=seconds))

    def advance(self, delta: timedelta) -> None:
        assert self._traveller is not None
        if delta > timedelta(0):
            self._traveller.shift(delta)

    def move_to(self, moment: datetime) -> None:
        if moment > self.now():
            self.advance(moment - self.now())


class SimulatedWaits:
    """The delivery drain's waits on the simulated clock: its retry waits (``drain.SLEEP``)
    and a run's wait for a receiver's next rate slot (``Deliverer``'s ``idle``, whose
    default the drain binds at import).

    Those waits are abortable (``sleep_with_abort`` waits on the shutdown event, in real
    time: on the frozen clock a run waiting for a slot would wait for ever); here they go
    through the simulated ``time.sleep``, still raising ``ShutdownRequested`` if the event
    is set, so a wait costs simulated time only."""

    def __enter__(self) -> Self:
        from sluice.core.errors import ShutdownRequested
        from sluice.core.shutdown import SHUTDOWN
        from sluice.delivery import drain

        def sleep(seconds: float) -> None:
            if SHUTDOWN.is_set():
                raise ShutdownRequested()
            time.sleep(seconds)

        self.saved = drain.SLEEP
        drain.SLEEP = sleep
        defaults = drain.Deliverer.__init__.__kwdefaults__
        assert defaults is not None and "idle" in defaults
        self.saved_idle = defaults["idle"]
        defaults["idle"] = sleep
        return self

    def __exit__(self, *exc: object) -> None:
        from sluice.delivery import drain

        drain.SLEEP = self.saved
        defaults = drain.Deliverer.__init__.__kwdefaults__
        assert defaults is not None
        defaults["idle"] = self.saved_idle
