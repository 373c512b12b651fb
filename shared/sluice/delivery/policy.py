"""The delivery policy: for every outcome of a send and every operator action, whether the
attempt counts, when the entry is next due, and who may send it again.

Decisions are values (``DeliveryDecision``), the way a retry strategy is data: the drain, the
store, the destinations and the limiter ask ``Policy`` and apply what it answers; none of
them decides on its own. ``TABLE`` is the whole policy, one row an outcome;
``docs/delivery.md`` shows it as a table, and tests/integration/delivery/test_policy_table.py
holds the two equal and walks every row against the store and the drain.

The rule behind the rows: only the entry's own failures count. An outage (the
destination, the limiter, the store), configuration (no adapter, refused credentials) and
a provider's pacing give the attempt back; a request that left without an answer counts
and is resent only as its channel allows (the unknown rule, ``may_resend``).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple

from sluice.delivery.classify import (
    CredentialsRefused,
    NoRateSlot,
    Verdict,
    _walk,
    classify,
    is_gone,
    is_unknown,
    over_cap,
)
from sluice.delivery.classify import TransientDeliveryError as _Transient

if TYPE_CHECKING:
    from sluice.core.settings import Settings


class DeliveryStatus(StrEnum):
    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    ACKED = "acked"
    FAILED = "failed"
    UNKNOWN = "unknown"  # sent, no answer, and not to be sent again without an operator


class FailureReason(StrEnum):
    PERMANENT = "permanent"
    MAX_ATTEMPTS = "max_attempts"
    LEASE_LOST = "lease_lost"
    EXPIRED = "expired"
    DESTINATION_DISABLED = "destination_disabled"


class DeliveryOutcome(StrEnum):
    """One row of the policy: what happened to a claimed entry (or what an operator did)."""

    ACKED = "acked"
    PERMANENT = "permanent"
    TRANSIENT = "transient, the entry's own"
    LAST_ATTEMPT = "transient, last attempt"
    DESTINATION_FAILING = "receiver failing"
    DESTINATION_HELD = "receiver held"
    DESTINATION_GONE = "destination gone"
    DESTINATION_STALE = "receiver failing past the limit"
    DESTINATION_DISABLED = "destination disabled"
    DESTINATION_PAUSED = "destination paused"
    NO_SLOT = "no rate slot"
    PACING = "pacing answer"
    PACING_PAST_CAP = "pacing answer past the cap"
    UNKNOWN = "unknown"
    UNKNOWN_RESTS = "unknown, no resend left"
    NOT_SENT = "store or limiter unavailable"
    NO_ADAPTER = "no adapter"
    LAPSED_SENT = "lease lapsed after the request"
    LAPSED_SENT_RESTS = "lease lapsed after the request, no resend left"
    LAPSED_UNSENT = "lease lapsed before the request"
    LAPSED_UNSENT_LIMIT = "lease lapsed before the request, fifth time in a row"
    FATAL = "out of memory"
    EXPIRED = "expired"
    REDRIVE = "redrive"
    SEND_AGAIN = "send again"
    REPLAY_ACKED = "replay acked"
    MARK_DELIVERED = "mark delivered"
    PURGE = "purge"
    PAUSE = "pause"
    RESUME = "resume, or the pause's end"
    DISABLE = "disable"


class Attempt(StrEnum):
    COUNTS = "counts"
    GIVEN_BACK = "given back"
    RESET = "reset to 0"
    KEPT = "kept"


class Due(StrEnum):
    NEVER = "never"
    NOW = "now"
    SCHEDULE = "the schedule's next step"
    SLOT = "when a slot frees"
    PROVIDER = "the provider's wait"
    PROBE = "its receiver's next probe"
    CONFIGURED = "once its channel is configured"
    PAUSE_END = "its destination's pause ends"


class Sender(StrEnum):
    DRAIN = "the drain"
    PROBE = "the drain, one probe per receiver"
    OPERATOR = "an operator"
    NOBODY = "nobody"


class DeliveryDecision(NamedTuple):
    outcome: DeliveryOutcome
    status: str  # a DeliveryStatus value, or "deleted"
    attempt: Attempt
    due: Due
    sender: Sender
    reason: FailureReason | None = None
    delay: timedelta = timedelta(0)  # until due, when the row's due is a wait

    @property
    def unknown(self) -> bool:
        """A send whose answer never came: counted in ``unknown_sends``."""
        return self.outcome in UNKNOWN_OUTCOMES


P, F, U, A = (DeliveryStatus.PENDING.value, DeliveryStatus.FAILED.value,
              DeliveryStatus.UNKNOWN.value, DeliveryStatus.ACKED.value)
_OFF = FailureReason.DESTINATION_DISABLED

# The policy, one row an outcome: (status, attempt, next due, sent again by, failure reason).
TABLE: dict[DeliveryOutcome, DeliveryDecision] = {row.outcome: row for row in (
    DeliveryDecision(DeliveryOutcome.ACKED, A, Attempt.COUNTS, Due.NEVER, Sender.NOBODY),
    DeliveryDecision(DeliveryOutcome.PERMANENT, F, Attempt.COUNTS, Due.NEVER, Sender.OPERATOR,
             FailureReason.PERMANENT),
    DeliveryDecision(DeliveryOutcome.TRANSIENT, P, Attempt.COUNTS, Due.SCHEDULE, Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.LAST_ATTEMPT, F, Attempt.COUNTS, Due.NEVER, Sender.OPERATOR,
             FailureReason.MAX_ATTEMPTS),
    DeliveryDecision(DeliveryOutcome.DESTINATION_FAILING, P, Attempt.GIVEN_BACK, Due.PROBE, Sender.PROBE),
    DeliveryDecision(DeliveryOutcome.DESTINATION_HELD, P, Attempt.GIVEN_BACK, Due.PROBE, Sender.PROBE),
    DeliveryDecision(DeliveryOutcome.DESTINATION_GONE, F, Attempt.COUNTS, Due.NEVER, Sender.OPERATOR,
             _OFF),
    DeliveryDecision(DeliveryOutcome.DESTINATION_STALE, F, Attempt.GIVEN_BACK, Due.NEVER,
             Sender.OPERATOR, _OFF),
    DeliveryDecision(DeliveryOutcome.DESTINATION_DISABLED, F, Attempt.GIVEN_BACK, Due.NEVER,
             Sender.OPERATOR, _OFF),
    DeliveryDecision(DeliveryOutcome.DESTINATION_PAUSED, P, Attempt.GIVEN_BACK, Due.PAUSE_END,
             Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.NO_SLOT, P, Attempt.GIVEN_BACK, Due.SLOT, Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.PACING, P, Attempt.GIVEN_BACK, Due.PROVIDER, Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.PACING_PAST_CAP, P, Attempt.GIVEN_BACK, Due.PROBE, Sender.PROBE),
    DeliveryDecision(DeliveryOutcome.UNKNOWN, P, Attempt.COUNTS, Due.SCHEDULE, Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.UNKNOWN_RESTS, U, Attempt.COUNTS, Due.NEVER, Sender.OPERATOR),
    DeliveryDecision(DeliveryOutcome.NOT_SENT, P, Attempt.GIVEN_BACK, Due.NOW, Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.NO_ADAPTER, P, Attempt.GIVEN_BACK, Due.CONFIGURED, Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.LAPSED_SENT, P, Attempt.COUNTS, Due.NOW, Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.LAPSED_SENT_RESTS, U, Attempt.COUNTS, Due.NEVER, Sender.OPERATOR),
    DeliveryDecision(DeliveryOutcome.LAPSED_UNSENT, P, Attempt.GIVEN_BACK, Due.NOW, Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.LAPSED_UNSENT_LIMIT, F, Attempt.GIVEN_BACK, Due.NEVER, Sender.OPERATOR,
             FailureReason.LEASE_LOST),
    DeliveryDecision(DeliveryOutcome.FATAL, P, Attempt.GIVEN_BACK, Due.NOW, Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.EXPIRED, F, Attempt.KEPT, Due.NEVER, Sender.OPERATOR,
             FailureReason.EXPIRED),
    DeliveryDecision(DeliveryOutcome.REDRIVE, P, Attempt.RESET, Due.NOW, Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.SEND_AGAIN, P, Attempt.RESET, Due.NOW, Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.REPLAY_ACKED, P, Attempt.RESET, Due.NOW, Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.MARK_DELIVERED, A, Attempt.KEPT, Due.NEVER, Sender.NOBODY),
    DeliveryDecision(DeliveryOutcome.PURGE, "deleted", Attempt.KEPT, Due.NEVER, Sender.NOBODY),
    DeliveryDecision(DeliveryOutcome.PAUSE, P, Attempt.KEPT, Due.PAUSE_END, Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.RESUME, P, Attempt.KEPT, Due.NOW, Sender.DRAIN),
    DeliveryDecision(DeliveryOutcome.DISABLE, F, Attempt.KEPT, Due.NEVER, Sender.OPERATOR, _OFF),
)}

UNKNOWN_OUTCOMES = frozenset({DeliveryOutcome.UNKNOWN, DeliveryOutcome.UNKNOWN_RESTS, DeliveryOutcome.LAPSED_SENT,
                              DeliveryOutcome.LAPSED_SENT_RESTS})
# The status an operator action starts from (a 409 otherwise).
OPERATOR_FROM: dict[DeliveryOutcome, tuple[str, ...]] = {
    DeliveryOutcome.REDRIVE: (F,), DeliveryOutcome.SEND_AGAIN: (U,), DeliveryOutcome.REPLAY_ACKED: (A,),
    DeliveryOutcome.MARK_DELIVERED: (U,), DeliveryOutcome.PURGE: (F, U)}


class RetrySchedule(NamedTuple):
    """Delays between attempts, as data: attempt 1 failed -> wait ``delays_s[0]``, and so on,
    the last delay repeating (the cap); after ``max_attempts`` attempts the entry fails."""

    delays_s: tuple[float, ...] = (5.0, 25.0, 120.0, 600.0)
    max_attempts: int = 5

    def step(self, n: int) -> timedelta:
        """The wait after the ``n``-th failure in a row (an attempt, or a probe)."""
        return timedelta(seconds=self.delays_s[min(max(n, 1), len(self.delays_s)) - 1])

    def table(self) -> list[tuple[int, float | None]]:
        """(failed attempt, seconds until the next one; None = failed for good)."""
        return [(n, self.step(n).total_seconds() if n < self.max_attempts else None)
                for n in range(1, self.max_attempts + 1)]


DEFAULT_SCHEDULE = RetrySchedule()
PACING_CAP_S = 3600.0  # the longest wait a provider's pacing answer is honoured for
DISABLE_AFTER = timedelta(days=5)  # failing this long without a success: disabled


def pacing_s(error: BaseException) -> float | None:
    """The wait a provider asked for with a 429 or ``Retry-After``, if it did (0 for a 429
    that names none); None when the error is not a pacing answer."""
    for node in _walk(error):
        if isinstance(node, _Transient):
            if node.over_cap:
                return None  # past the cap: no wait to honour (the destination is failing)
            if node.retry_after_s is not None:
                return node.retry_after_s
            if node.context.get("status") == 429:
                return 0.0
    return None


def retry_in_process(error: BaseException) -> bool:
    """Retried at once inside one send (``sluice.delivery.retry``): a transient error that
    provably did not deliver, so neither refused credentials (a second try is refused the
    same way) nor an unknown outcome (the receiver may have it: resending is the queue's
    decision, by channel, never a reflex)."""
    return (classify(error) == "transient" and not _credentials(error)
            and not is_unknown(error))


def answered(error: BaseException) -> bool:
    """The receiver answered the request (an HTTP status, or a platform's own refusal):
    what it said is about this entry unless other entries fail there too. A transient
    error without a status (refused, not connected, DNS) never reached it."""
    return any(isinstance(node, _Transient) and node.context.get("status") is not None
               for node in _walk(error))


def _credentials(error: BaseException) -> bool:
    return any(isinstance(node, CredentialsRefused) for node in _walk(error))


class Policy:
    def __init__(self, schedule: RetrySchedule = DEFAULT_SCHEDULE, *, unknown_resends: int = 1,
                 deduplicating: frozenset[str] = frozenset(),
                 pacing_cap_s: float = PACING_CAP_S,
                 disable_after: timedelta = DISABLE_AFTER) -> None:
        self.schedule = schedule
        self.unknown_resends = unknown_resends  # for channels that cannot deduplicate
        self.deduplicating = deduplicating
        self.pacing_cap_s = pacing_cap_s
        self.disable_after = disable_after

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        """The policy a deployment's settings configure (the channels that deduplicate are
        the channels' to say: ``knowing``)."""
        return cls(unknown_resends=settings.delivery_unknown_resends,
                   pacing_cap_s=float(settings.delivery_pacing_cap_s),
                   disable_after=timedelta(seconds=settings.destination_disable_after_s))

    def knowing(self, deduplicating: frozenset[str]) -> Policy:
        """This policy, told which channels' receivers drop a repeat by its key."""
        return Policy(self.schedule, unknown_resends=self.unknown_resends,
                      deduplicating=deduplicating, pacing_cap_s=self.pacing_cap_s,
                      disable_after=self.disable_after)

    # --- which row ---------------------------------------------------------------------

    def may_resend(self, channel: str, attempts: int, unknown_sends: int) -> bool:
        """The unknown rule: after a send without answer (the ``unknown_sends``-th, counted
        before this one), one more while the attempt limit allows and, unless the channel
        deduplicates, only ``unknown_resends`` more in all."""
        return attempts < self.schedule.max_attempts and (
            channel in self.deduplicating or unknown_sends + 1 <= self.unknown_resends)

    def honoured(self, wait_s: float | None) -> bool:
        """A pacing answer the policy waits for: a finite wait within the cap."""
        return wait_s is not None and math.isfinite(wait_s) and 0 < wait_s <= self.pacing_cap_s

    def before_send(self, *, disabled: bool, paused: bool) -> DeliveryOutcome | None:
        """The row for an entry claimed while its destination is disabled or paused (an
        entry the drain had not seen before the change: the others were settled by it); None
        when it may be sent."""
        if disabled:
            return DeliveryOutcome.DESTINATION_DISABLED
        if paused:
            return DeliveryOutcome.DESTINATION_PAUSED
        return None

    def stale(self, failing_since: datetime | None, now: datetime) -> bool:
        """A destination failing since ``failing_since`` without a single success has failed
        for too long: it is disabled."""
        return failing_since is not None and now - failing_since >= self.disable_after

    def after_send(self, verdict: Verdict | str, error: BaseException | None, *, channel: str,
                   attempts: int, unknown_sends: int, receiver_failing: bool = False,
                   another_failed: bool = False, failing_since: datetime | None = None,
                   now: datetime | None = None) -> DeliveryOutcome:
        """The row for what one send came to. ``receiver_failing``: its receiver is held as
        failing (this send was its probe, or went inline meanwhile); ``another_failed``:
        another entry's answered failure began the receiver's current streak, with no
        success since; ``failing_since``: when its receiver started failing, if it is (a
        further failure past ``disable_after`` from then disables it).

        Whose failure it is: the entry's own (counted, on the schedule, failed after the
        last attempt) when the receiver answered it and no other entry is failing there;
        the receiver's (held, the attempt given back, one probe at a time) when it was not
        reached (refused, not connected, no slot it named), refused Sluice's credentials,
        is held already, or a second entry fails before any success."""
        if verdict == "fatal":
            return DeliveryOutcome.FATAL
        if verdict == "acked":
            return DeliveryOutcome.ACKED
        if verdict == "permanent":
            assert error is not None
            return DeliveryOutcome.DESTINATION_GONE if is_gone(error) else DeliveryOutcome.PERMANENT
        assert error is not None
        outcome = self._transient(error, channel=channel, attempts=attempts,
                                  unknown_sends=unknown_sends,
                                  alone=not (receiver_failing or another_failed))
        if outcome in (DeliveryOutcome.DESTINATION_FAILING, DeliveryOutcome.PACING_PAST_CAP) and (
                now is not None and self.stale(failing_since, now)):
            return DeliveryOutcome.DESTINATION_STALE
        return outcome

    def _transient(self, error: BaseException, *, channel: str, attempts: int,
                   unknown_sends: int, alone: bool) -> DeliveryOutcome:
        if is_unknown(error):
            return (DeliveryOutcome.UNKNOWN if self.may_resend(channel, attempts, unknown_sends)
                    else DeliveryOutcome.UNKNOWN_RESTS)
        if any(isinstance(node, NoRateSlot) for node in _walk(error)):
            return DeliveryOutcome.NO_SLOT  # our own limiter, before a further chunk left
        if over_cap(error):
            return DeliveryOutcome.PACING_PAST_CAP
        wait = pacing_s(error)
        if wait is not None and wait != 0:
            return DeliveryOutcome.PACING if self.honoured(wait) else DeliveryOutcome.PACING_PAST_CAP
        if wait is not None or _credentials(error) or not answered(error) or not alone:
            # a 429 naming no wait, refused credentials (configuration), a receiver not
            # reached, or one failing for more than this entry: the receiver waits
            return DeliveryOutcome.DESTINATION_FAILING
        return DeliveryOutcome.TRANSIENT if attempts < self.schedule.max_attempts else DeliveryOutcome.LAST_ATTEMPT

    def after_lapse(self, channel: str, attempts: int, unknown_sends: int,
                    request_left: bool, unsent_lapses: int = 0,
                    its_turn: bool = True) -> DeliveryOutcome:
        """The row for a lease that lapsed; ``unsent_lapses`` counts those before it that
        lapsed in a row at its turn before its request left (an entry that kills its sender
        before the send must not stall the queue: the limit ends it, not sent). An entry its
        sender never reached (``its_turn`` False: another of its claim came first) did not
        kill it: the lapse is not counted against it."""
        if not request_left:
            return (DeliveryOutcome.LAPSED_UNSENT
                    if not its_turn or unsent_lapses + 1 < self.schedule.max_attempts
                    else DeliveryOutcome.LAPSED_UNSENT_LIMIT)
        return (DeliveryOutcome.LAPSED_SENT if self.may_resend(channel, attempts, unknown_sends)
                else DeliveryOutcome.LAPSED_SENT_RESTS)

    # --- what it means ---------------------------------------------------------------

    def decide(self, outcome: DeliveryOutcome, *, attempts: int = 0,
               wait: timedelta | None = None) -> DeliveryDecision:
        """``TABLE``'s row, with the delay until due filled in: the schedule's step after
        ``attempts`` failures, or ``wait`` (a slot, the provider's answer, the probe)."""
        row = TABLE[outcome]
        if row.due is Due.SCHEDULE:
            return row._replace(delay=self.schedule.step(attempts))
        if row.due in (Due.SLOT, Due.PROVIDER, Due.PROBE, Due.PAUSE_END):
            return row._replace(delay=max(wait or timedelta(0), timedelta(0)))
        return row

    def probe_wait(self, failures: int, asked_s: float | None = None) -> timedelta:
        """A failing destination's wait until its next probe: the schedule's step after
        ``failures`` failed probes, or the provider's honoured wait when longer."""
        step = self.schedule.step(failures)
        if self.honoured(asked_s):
            assert asked_s is not None
            return max(step, timedelta(seconds=asked_s))
        return step


DELIVERY_POLICY = Policy()

__all__ = [
    "DEFAULT_SCHEDULE",
    "DELIVERY_POLICY",
    "DISABLE_AFTER",
    "OPERATOR_FROM",
    "PACING_CAP_S",
    "TABLE",
    "Attempt",
    "DeliveryDecision",
    "DeliveryOutcome",
    "DeliveryStatus",
    "Due",
    "FailureReason",
    "Policy",
    "RetrySchedule",
    "Sender",
    "pacing_s",
]
