"""Whose an answered failure is (``streaks.py``): an entry's alone, until a second entry
fails at the same receiver before any success; from then on the receiver's, and the first
one's attempt is given back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bench.simulate.pacing import Request
from bench.simulate.streaks import Streaks

T0 = datetime(2026, 1, 5, tzinfo=UTC)
A = ("telegram", "1001", 1)
B = ("telegram", "1001", 2)
C = ("telegram", "1001", 3)


def _asked(streaks: Streaks, match: tuple[str, str, int], seconds: float, answer: str) -> None:
    streaks.request(Request(T0 + timedelta(seconds=seconds), match[0], match[1], match[2],
                            answer, None, 10.0))


def test_a_lone_failure_counts_once_per_send_and_a_second_entry_gives_it_back() -> None:
    # GIVEN an entry answered 500 three times within one send (the in-process retries)
    streaks = Streaks()
    for at in (0.0, 0.3, 0.9):
        _asked(streaks, A, at, "error")
    # THEN one attempt may stand for its three requests
    assert streaks.uncounted(A) == 2
    # WHEN another entry fails there before any success
    _asked(streaks, B, 5.0, "error")
    _asked(streaks, C, 6.0, "error")
    # THEN every one of those failures was the receiver's: none may count
    assert [streaks.uncounted(m) for m in (A, B, C)] == [3, 1, 1]


def test_a_success_ends_the_streak_and_a_crash_undoes_the_unconcluded_send() -> None:
    # GIVEN a lone failure, a success, then another lone failure at the receiver
    streaks = Streaks()
    _asked(streaks, A, 0.0, "error")
    _asked(streaks, C, 10.0, "up")
    _asked(streaks, B, 20.0, "error")
    # THEN each counts its own attempt
    assert (streaks.uncounted(A), streaks.uncounted(B)) == (0, 0)
    # WHEN a further entry fails and its sender dies before concluding the send
    _asked(streaks, C, 30.0, "error")
    streaks.undo()
    # THEN Sluice never learnt of it: the streak is B's alone, as before
    assert (streaks.uncounted(B), streaks.uncounted(C)) == (0, 0)
