"""Work deferred until the response is sent: ``run_after_response(work, on_error)``.

Where the work runs depends on where the caller is:

* inside an HTTP request served by the app (uvicorn locally), the request's collector
  (installed by ``sluice.http.after``) takes it, and it runs as a Starlette background
  task once the response has been sent;
* on Lambda the same collector is used, and Mangum awaits the app, background tasks
  included, before the handler returns: the work runs after the response is complete
  but before it is handed back, so nothing runs once the handler has returned and the
  answer (status and body, already fixed) cannot be changed by it;
* anywhere else (a cron run, a queue consumer, the command line) it runs at once.

Whatever the path, an exception from ``work`` never propagates: it goes to
``on_error`` and to the error sink (the reporter's ``after-response`` context).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING

from sluice.core import trace

if TYPE_CHECKING:
    from sluice.core.observe import Reporter

Work = Callable[[], object]
OnError = Callable[[BaseException], object]

# The current request's collector (None outside a request).
collector: ContextVar[list[Callable[[], None]] | None] = ContextVar("after_response",
                                                                   default=None)


def guarded(work: Work, on_error: OnError, reporter: Reporter | None = None) -> Callable[[], None]:
    """``work`` wrapped so that its error reaches ``on_error`` and the sink, never the caller."""

    def run() -> None:
        try:
            work()
        except Exception as exc:  # noqa: BLE001 - deferred work never fails its request
            try:
                on_error(exc)
            except Exception as handler_exc:  # noqa: BLE001 - the sink still hears of it
                sink(reporter).error("after-response.on_error", handler_exc)
            sink(reporter).error("after-response", exc)

    return run


def sink(reporter: Reporter | None) -> Reporter:
    if reporter is not None:
        return reporter
    from sluice.core.observe import Reporter

    return Reporter()


def run_after_response(work: Work, on_error: OnError, *,
                       reporter: Reporter | None = None) -> bool:
    """Run ``work`` after the current response (True), or now when there is none (False)."""
    task = guarded(work, on_error, reporter)
    pending = collector.get()
    if pending is not None:
        pending.append(_traced(task, trace.carrier()))
        return True
    task()
    return False


def _traced(task: Callable[[], None], deferred_by: trace.Carrier) -> Callable[[], None]:
    """``task`` as a span in the trace of the span that deferred it (the request's, a
    job's): what it does (an alert's enqueue) belongs to that story."""
    if not deferred_by:  # telemetry off, or nothing to join
        return task

    def run() -> None:
        with trace.span("after response", parent=deferred_by):
            task()

    return run
