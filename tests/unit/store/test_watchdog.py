"""The store watchdog holds what is in flight, not every call a run made."""

from __future__ import annotations

import threading
import tracemalloc

from sluice.store.deadline import _WATCHDOG, abandon_at_deadline, bounded_by

CALLS = 20_000


def test_twenty_thousand_calls_leave_a_handful_of_watches_and_little_memory() -> None:
    # GIVEN a run with an hour left, WHEN it makes 20,000 store calls one after another
    tracemalloc.start()
    try:
        with bounded_by(lambda: 3600.0):
            with abandon_at_deadline(lambda: None):
                pass
            before, _ = tracemalloc.get_traced_memory()
            for _ in range(CALLS):
                with abandon_at_deadline(lambda: None):
                    pass
            after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # THEN the watchdog keeps fewer than COMPACT_AT of them (none is in flight), and the
    # run's memory did not grow by them (10.5 MB before the fix; a few KB now)
    assert _WATCHDOG.held() < _WATCHDOG.COMPACT_AT
    assert after - before < 64 * 1024, f"{after - before} bytes kept after {CALLS} calls"


def test_calls_in_flight_are_kept_whatever_ended_around_them() -> None:
    # GIVEN 50 calls in flight while 20,000 others start and end around them
    cut: list[int] = []
    with bounded_by(lambda: 3600.0):
        held = [abandon_at_deadline(lambda n=n: cut.append(n)) for n in range(50)]  # type: ignore[misc]
        watches = [h.__enter__() for h in held]
        for _ in range(CALLS):
            with abandon_at_deadline(lambda: None):
                pass
        # THEN the heap holds at most twice what is in flight (plus the rebuild's slack)
        assert _WATCHDOG.held() <= 2 * len(watches) + _WATCHDOG.COMPACT_AT
        assert sum(1 for _, _, w in _WATCHDOG._heap if not w.done) == 50
        for h in held:
            h.__exit__()
    assert not any(w.fired for w in watches) and cut == []


def test_a_call_still_waiting_at_the_deadline_is_cut_after_many_ended() -> None:
    # GIVEN many ended calls, and one that is still waiting when its bound runs out
    fired = threading.Event()
    with bounded_by(lambda: 3600.0):
        for _ in range(1_000):
            with abandon_at_deadline(lambda: None):
                pass
    with bounded_by(lambda: 0.05), abandon_at_deadline(fired.set) as watch:
        # THEN the watchdog cuts it (the socket shutdown stand-in runs)
        assert fired.wait(10)
    assert watch.fired
