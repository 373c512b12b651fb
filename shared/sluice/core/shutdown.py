"""Shutdown: one process-wide event that cuts every wait short.

``sluice dev`` stops on Ctrl-C, and a host that stops a process with SIGTERM (a
container) says so first. Lambda sends a runtime SIGTERM only when an extension is
registered, which Sluice does not do: there the run's deadline, which every wait is held
under, is what ends a wait in time. A retry wait that sleeps through a shutdown delays it
and risks being killed mid-send, so waits go through :func:`sleep_with_abort`, which ends
at once when :data:`SHUTDOWN` is set and raises ``ShutdownRequested``. The caller then hands
the failed attempt back to the queue, whose own schedule retries it on a later run.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

from sluice.core.errors import ShutdownRequested

SHUTDOWN = threading.Event()


def sleep_with_abort(seconds: float, abort: threading.Event | None = None) -> None:
    """Wait ``seconds``, or raise ``ShutdownRequested`` as soon as ``abort`` is set."""
    if (abort or SHUTDOWN).wait(max(0.0, seconds)):
        raise ShutdownRequested()


def install(signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)) -> bool:
    """Set :data:`SHUTDOWN` on these signals, then call the handler that was there before.

    Signal handlers can only be set from the main thread: elsewhere this does nothing
    and says so (False)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for signum in signals:
        previous = signal.getsignal(signum)

        def handle(number: int, frame: FrameType | None,
                   previous: object = previous) -> None:
            SHUTDOWN.set()
            if callable(previous):
                previous(number, frame)

        signal.signal(signum, handle)
    return True
