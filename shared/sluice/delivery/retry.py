"""Immediate retries inside one send, on tenacity.

``RetryPolicy`` is data: 3 attempts, 300 ms doubling up to 30 s, optional jitter
(a fraction of the delay added at random). ``Retrier.call(fn, label=)`` runs ``fn``
and retries what ``should_retry`` accepts (by default what the delivery policy retries in
process, ``sluice.delivery.policy.retry_in_process``),
waiting the policy's delay or the server's ``Retry-After`` if that is longer. A wait
is never started when it would end past the run's deadline less one send, nor when
the server asks for longer than the policy's maximum (or past the pacing cap,
``sluice.egress.pacing``): the error then goes back to the caller, and the delivery
policy decides what follows (``sluice.delivery.policy``): the entry waits the server's own
time, its attempt given back, when the server named one within the pacing cap; else the
queue's schedule (5 s / 25 s / 2 min / 10 min, across runs). The wait ends at once on
shutdown (``sluice.core.shutdown``: Ctrl-C in ``sluice dev``, SIGTERM on Lambda, which
sends it because each function registers an internal extension at init), and a wait is not started once
shutdown has begun; the last attempt's error then goes back to the caller as if the
retries had run out. After the wait, right before its request, a retry runs
``before_retry`` (the drain's: a rate slot, ``Limiter.further``). ``sleep``,
the abort event and the deadline's clock are injected, so tests never wait.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_any,
)
from tenacity.stop import stop_base

from sluice.core.errors import ShutdownRequested
from sluice.core.observe import logger
from sluice.core.shutdown import SHUTDOWN, sleep_with_abort
from sluice.delivery.classify import NoRateSlot, over_cap, retry_after_s
from sluice.delivery.policy import retry_in_process as transient

T = TypeVar("T")


class RetryPolicy(NamedTuple):
    attempts: int = 3
    min_delay_s: float = 0.3
    max_delay_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.0  # 0.1 adds up to 10 % of the delay at random

    def delay(self, failed_attempt: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed attempt ``failed_attempt`` (1-based)."""
        base = min(self.min_delay_s * self.factor ** (failed_attempt - 1), self.max_delay_s)
        return min(base + base * self.jitter * rng(), self.max_delay_s)


DEFAULT_POLICY = RetryPolicy()


class _StopBeforeLongWait(stop_base):
    """Stop rather than start a wait longer than the policy allows or the deadline leaves."""

    def __init__(self, retrier: Retrier) -> None:
        self.retrier = retrier

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.retrier._stop(retry_state)


class Retrier:
    def __init__(self, policy: RetryPolicy = DEFAULT_POLICY, *,
                 sleep: Callable[[float], None] | None = None,
                 abort: threading.Event = SHUTDOWN,
                 remaining: Callable[[], float] | None = None, reserve_s: float = 0.0,
                 should_retry: Callable[[BaseException], bool] = transient,
                 retry_after: Callable[[BaseException], float | None] = retry_after_s,
                 on_retry: Callable[[BaseException, int, float], None] | None = None,
                 before_retry: Callable[[], None] | None = None,
                 rng: Callable[[], float] = random.random) -> None:
        """``remaining()`` is the run's time left; a wait must leave ``reserve_s`` (one send).
        ``on_retry`` hears of each retry before its wait; ``before_retry`` runs after the
        wait, right before the retry's request (an error it raises ends the call)."""
        self.policy = policy
        self.abort = abort
        self.sleep = sleep or (lambda seconds: sleep_with_abort(seconds, abort))
        self.remaining = remaining
        self.reserve_s = reserve_s
        self.should_retry = should_retry
        self.retry_after = retry_after
        self.on_retry = on_retry
        self.before_retry = before_retry
        self.rng = rng

    def _wait(self, state: RetryCallState) -> float:
        delay = self.policy.delay(state.attempt_number, self.rng)
        error = state.outcome.exception() if state.outcome else None
        asked = self.retry_after(error) if error is not None else None
        return max(delay, asked) if asked is not None else delay

    def _stop(self, state: RetryCallState) -> bool:
        wait = state.upcoming_sleep
        if self.abort.is_set():
            return True  # shutting down: no new wait
        if wait > self.policy.max_delay_s:
            return True  # the server wants longer than we wait in-process
        error = state.outcome.exception() if state.outcome else None
        if error is not None and over_cap(error):
            return True  # past the pacing cap: its destination is failing, not to be waited on
        return self.remaining is not None and wait + self.reserve_s > self.remaining()

    def call(self, fn: Callable[[], T], *, label: str) -> T:
        last: list[BaseException] = []

        def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            assert error is not None
            last[:] = [error]
            logger.info(f"[delivery] {label}: attempt {state.attempt_number} failed "
                        f"({type(error).__name__}: {error}); retrying in "
                        f"{state.upcoming_sleep:.2f} s",
                        extra={"label": label, "attempt": state.attempt_number,
                               "delayS": state.upcoming_sleep})
            if self.on_retry is not None:
                self.on_retry(error, state.attempt_number, state.upcoming_sleep)

        def before(state: RetryCallState) -> None:
            if state.attempt_number > 1 and self.before_retry is not None:
                try:
                    self.before_retry()
                except NoRateSlot:
                    # no slot for the retry in time: the retry is not made, and the send
                    # ends with the answer it had (a failing receiver's schedule holds)
                    raise last[0] from None

        retrying = Retrying(
            before=before,
            stop=stop_any(stop_after_attempt(self.policy.attempts), _StopBeforeLongWait(self)),
            wait=self._wait,
            retry=retry_if_exception(self.should_retry),
            sleep=self.sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            return retrying(fn)
        except ShutdownRequested:
            if not last:
                raise
            # The wait was cut: the attempt that failed is the answer, not the shutdown.
            raise last[0] from None
