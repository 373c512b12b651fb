"""run_after_response outside a request: runs at once; an error goes to on_error and the
sink, never to the caller (also when on_error itself fails)."""

from __future__ import annotations

from typing import Any

from sluice.core.after import collector, run_after_response
from sluice.core.observe import Reporter


class Sink(Reporter):
    def __init__(self) -> None:
        super().__init__()
        self.errors: list[tuple[str, BaseException | None]] = []

    def error(self, context: str, exc: BaseException | None = None, **extra: Any) -> None:
        self.errors.append((context, exc))


def test_outside_a_request_the_work_runs_now() -> None:
    done: list[int] = []
    assert run_after_response(lambda: done.append(1), lambda exc: None) is False
    assert done == [1]


def test_inside_a_request_the_work_waits_for_the_collector() -> None:
    pending: list[Any] = []
    token = collector.set(pending)
    try:
        done: list[int] = []
        assert run_after_response(lambda: done.append(1), lambda exc: None) is True
        assert done == [] and len(pending) == 1
    finally:
        collector.reset(token)
    pending[0]()
    assert done == [1]


def boom() -> None:
    raise RuntimeError("work failed")


def test_an_error_reaches_on_error_and_the_sink_not_the_caller() -> None:
    sink, seen = Sink(), []
    run_after_response(boom, seen.append, reporter=sink)
    assert [str(e) for e in seen] == ["work failed"]
    assert [(c, str(e)) for c, e in sink.errors] == [("after-response", "work failed")]


def test_a_failing_on_error_still_reaches_the_sink() -> None:
    sink = Sink()

    def bad_handler(exc: BaseException) -> None:
        raise ValueError("handler failed")

    run_after_response(boom, bad_handler, reporter=sink)
    assert [(c, str(e)) for c, e in sink.errors] == [
        ("after-response.on_error", "handler failed"), ("after-response", "work failed")]
