"""In-process retries: the policy as data, Retry-After, should_retry, on_retry, and a wait
that the deadline or an over-long Retry-After cancels. The sleep is injected."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from sluice.core.errors import ShutdownRequested
from sluice.core.shutdown import SHUTDOWN, install, sleep_with_abort
from sluice.delivery.channels.base import refused, send_chunks
from sluice.delivery.classify import PermanentDeliveryError, TransientDeliveryError
from sluice.delivery.policy import pacing_s as rate_limited_for_s
from sluice.delivery.retry import Retrier, RetryPolicy
from sluice.egress.pacing import Pacing


class Flaky:
    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "sent"


def test_the_default_policy_doubles_from_300_ms_up_to_30_s() -> None:
    policy = RetryPolicy()
    assert (policy.attempts, policy.min_delay_s, policy.max_delay_s, policy.factor) == (
        3, 0.3, 30.0, 2.0)
    assert [policy.delay(n) for n in (1, 2, 3, 10)] == [0.3, 0.6, 1.2, 30.0]
    jittered = RetryPolicy(jitter=0.5)
    assert jittered.delay(1, rng=lambda: 1.0) == pytest.approx(0.45)
    assert jittered.delay(1, rng=lambda: 0.0) == pytest.approx(0.3)


def test_transient_errors_are_retried_with_the_policys_waits() -> None:
    sleeps: list[float] = []
    seen: list[tuple[str, int, float]] = []
    retrier = Retrier(sleep=sleeps.append,
                      on_retry=lambda exc, n, wait: seen.append((str(exc), n, wait)))
    fn = Flaky(TransientDeliveryError("503"), TransientDeliveryError("503 again"))

    assert retrier.call(fn, label="test") == "sent"

    assert fn.calls == 3 and sleeps == [0.3, 0.6]
    assert seen == [("503", 1, 0.3), ("503 again", 2, 0.6)]


def test_the_last_error_is_raised_after_the_last_attempt() -> None:
    fn = Flaky(*(TransientDeliveryError(f"down {i}") for i in range(3)))
    with pytest.raises(TransientDeliveryError, match="down 2"):
        Retrier(sleep=lambda s: None).call(fn, label="test")
    assert fn.calls == 3


def test_permanent_errors_are_not_retried() -> None:
    fn = Flaky(PermanentDeliveryError("chat not found"))
    sleeps: list[float] = []
    with pytest.raises(PermanentDeliveryError):
        Retrier(sleep=sleeps.append).call(fn, label="test")
    assert fn.calls == 1 and sleeps == []


def test_should_retry_decides() -> None:
    fn = Flaky(ValueError("x"), ValueError("y"))
    retrier = Retrier(sleep=lambda s: None, should_retry=lambda e: isinstance(e, ValueError))
    assert retrier.call(fn, label="test") == "sent" and fn.calls == 3


def test_retry_after_lengthens_a_wait_and_too_long_a_wait_is_left_to_the_queue() -> None:
    sleeps: list[float] = []
    fn = Flaky(TransientDeliveryError("429", retry_after_s=4))
    assert Retrier(sleep=sleeps.append).call(fn, label="t") == "sent" and sleeps == [4]

    fn = Flaky(TransientDeliveryError("429", retry_after_s=31))
    with pytest.raises(TransientDeliveryError):
        Retrier(sleep=sleeps.append).call(fn, label="t")
    assert fn.calls == 1 and sleeps == [4], "no 31 s wait in-process"


def test_an_answer_past_the_pacing_cap_is_not_waited_on_in_process_nor_held_as_a_rate() -> None:
    # a cap set below the in-process maximum: 10 s honoured would be waited; past it, not
    over = refused("429", status=429, pacing=Pacing(asked_s=20, cap_s=10))
    fn = Flaky(over)
    sleeps: list[float] = []
    with pytest.raises(TransientDeliveryError):
        Retrier(sleep=sleeps.append).call(fn, label="t")
    assert fn.calls == 1 and sleeps == []
    assert isinstance(over, TransientDeliveryError) and over.retry_after_s is None
    assert rate_limited_for_s(over) is None, "its destination is failing, no key is held"
    assert rate_limited_for_s(TransientDeliveryError("429", retry_after_s=10)) == 10


def test_no_wait_starts_that_would_end_past_the_deadline() -> None:
    clock = [0.0]
    deadline_at = 10.0
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock[0] += seconds

    retrier = Retrier(RetryPolicy(attempts=10, min_delay_s=2.0), sleep=sleep,
                      remaining=lambda: deadline_at - clock[0], reserve_s=3.0)
    fn = Flaky(*(TransientDeliveryError("down") for _ in range(10)))
    with pytest.raises(TransientDeliveryError):
        retrier.call(fn, label="t")
    assert sleeps == [2.0, 4.0], "a 8 s wait plus a 3 s send does not fit in the 4 s left"
    assert clock[0] + 3.0 <= deadline_at


def test_best_effort_skips_a_refused_chunk_and_keeps_the_rest() -> None:
    retrier = Retrier(sleep=lambda s: None)

    def send(text: str) -> str:
        if text == "bad":
            raise PermanentDeliveryError("can't parse entities")
        return f"id-{text}"

    assert send_chunks(["a", "bad", "b"], send, retrier=retrier, label="t",
                       best_effort=True) == "id-a,id-b"
    with pytest.raises(PermanentDeliveryError):
        send_chunks(["a", "bad", "b"], send, retrier=retrier, label="t", best_effort=False)
    with pytest.raises(PermanentDeliveryError):
        send_chunks(["bad"], send, retrier=retrier, label="t", best_effort=True)


def test_best_effort_still_fails_the_send_on_a_transient_chunk() -> None:
    def send(text: str) -> str:
        if text == "busy":
            raise TransientDeliveryError("503")
        return f"id-{text}"

    with pytest.raises(TransientDeliveryError):
        send_chunks(["a", "busy", "b"], send, retrier=Retrier(RetryPolicy(attempts=1)),
                    label="t", best_effort=True)


def test_a_wait_ends_at_once_on_shutdown_and_the_attempts_error_is_the_answer() -> None:
    abort = threading.Event()
    fn = Flaky(TransientDeliveryError("503 first"), TransientDeliveryError("503 second"))
    # The signal lands just as the 30 s wait begins (the real, abortable sleep).
    retrier = Retrier(RetryPolicy(min_delay_s=30.0, max_delay_s=60.0), abort=abort,
                      on_retry=lambda error, attempt, wait: abort.set())
    started = time.monotonic()
    with pytest.raises(TransientDeliveryError, match="503 first"):
        retrier.call(fn, label="t")
    assert time.monotonic() - started < 20, "the 30 s wait was cut short"
    assert fn.calls == 1, "no new attempt after the shutdown"


def test_no_wait_starts_once_shutdown_has_begun() -> None:
    abort = threading.Event()
    abort.set()
    sleeps: list[float] = []
    fn = Flaky(TransientDeliveryError("503"))
    with pytest.raises(TransientDeliveryError):
        Retrier(sleep=sleeps.append, abort=abort).call(fn, label="t")
    assert sleeps == [] and fn.calls == 1


def test_sleep_with_abort_raises_on_the_event() -> None:
    abort = threading.Event()
    abort.set()
    with pytest.raises(ShutdownRequested):
        sleep_with_abort(3600, abort)
    sleep_with_abort(0.0, threading.Event())


def test_sigterm_sets_the_shutdown_event() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    seen: list[int] = []
    signal.signal(signal.SIGTERM, lambda n, f: seen.append(n))
    try:
        assert install()
        signal.raise_signal(signal.SIGTERM)
        assert SHUTDOWN.is_set() and seen == [signal.SIGTERM], "the old handler still runs"
    finally:
        SHUTDOWN.clear()
        signal.signal(signal.SIGTERM, previous)
