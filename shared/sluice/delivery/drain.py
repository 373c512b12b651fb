"""Sending from the delivery queue: the inline path and the ``delivery-drain`` job.

Inline, ``Deliverer.deliver`` stores the entry (``in_flight``, attempt 1, under a
lease) before it calls the adapter, then settles it. If the process dies between
the two, the lease lapses and the next drain sends it: at-least-once, and a
webhook receiver can drop the duplicate by its ``Idempotency-Key``.

The drain fails pending entries past the expiry (reason ``expired``), settles lapsed
leases, sets aside the entries of channels without an adapter, then claims batches in
turns across receivers (a probe for each failing destination whose probe is due, then due
entries that wait on nothing) and sends each batch a round at a time, until none is due
or the deadline is near (with ``delivery_drain_concurrency`` above 1, that many workers do
so at once); finally it prunes settled entries past their retention (their effect records
stay). A round's entries share no rate key; one statement marks them leaving before any
request leaves, each takes its rate slot just before its send, and the round's outcomes
settle in one commit after its last send returned. What becomes of
the entry after each of these steps (whether the attempt counts, when it is due, who
sends it again) is the delivery policy's decision (``sluice.delivery.policy``); this
module finds out what happened and applies the answer.

Its result (the keys a scheduler or an alarm reads, stable across versions):

- ``recovered``: entries delivered (acked) by this run;
- ``failed``: entries failed for good by this run (a permanent error, or ``expired``);
- ``skippedMaxRetries``: entries failed by this run because their last attempt (the
  fifth) failed transiently;
- ``deferredBackoff``: entries this run skipped because they were still in backoff;

and beside it ``expired`` (with ``expiredWaiting``: those expired while a failing
destination or a channel without adapter held them, per key), ``unknown`` (sends of
this run, and lapsed leases, whose outcome is unknown), ``leftDue`` (due, not reached
before the deadline), ``unconfigured``, ``outages`` (``count``: entries that waited on a
destination this run; ``down``: each destination reported down, with why;
``destinations``: every failing destination with its entries waiting), ``rateLimited``
(entries set aside, their attempt given back, for a rate slot or a provider's pacing),
``notSent`` (entries put back with their attempt because the limiter failed before the
request left; the run then stops, with ``notSentError``), ``fatal`` (1 when the run
stopped out of memory, with ``fatalError``), ``disabled`` (each destination this run
disabled, with why: a ``410 Gone``, a chat gone, or failing past
``SLUICE_DESTINATION_DISABLE_AFTER``; each is also reported to the error tracker),
``failedDisabled`` (entries failed ``destination_disabled`` by this run, apart from
``failed``: the destination is what failed, and its disable pages once) and ``paused``
(entries that waited on a paused destination this run).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple, TypedDict

from sluice.core import trace
from sluice.core.crash import crash_point
from sluice.core.errors import RequestError, StoreError
from sluice.core.observe import Reporter, logger
from sluice.core.services import Services
from sluice.core.shutdown import SHUTDOWN, sleep_with_abort
from sluice.core.times import iso_z, iso_z_or_none
from sluice.core.trace import SYSTEM_SLUICE
from sluice.delivery.channels import (
    ChannelAdapter,
    Outbound,
    build_adapters,
    channels,
    check_recipient,
    deduplicating,
)
from sluice.delivery.chunks import ChunkLog, SendProgress
from sluice.delivery.classify import DestinationDisabled, classify, describe, retry_after_s
from sluice.delivery.destinations import Destinations, FailingDestination, Streak
from sluice.delivery.payload import parse
from sluice.delivery.policy import DeliveryOutcome, Policy, pacing_s
from sluice.delivery.ratelimit import Limiter
from sluice.delivery.retry import DEFAULT_POLICY, Retrier, RetryPolicy
from sluice.delivery.store import UNCONFIGURED, DeliveryEntry, DeliveryStore, Settle
from sluice.jobs.registry import Deadline, JobContext
from sluice.store.db import utcnow

# The sleep of in-process retries in a drain run (tests replace it: no real waiting);
# it ends at once on shutdown.
SLEEP: Callable[[float], None] = sleep_with_abort


class SendOutcome(StrEnum):
    ACKED = "acked"
    RETRY = "retry"  # back to pending, on the schedule
    UNKNOWN = "unknown"  # sent, no answer: resent later only as its channel allows
    FAILED = "failed"  # permanent error
    GAVE_UP = "gave_up"  # the last attempt failed
    STALE = "stale"  # the entry was no longer ours to settle (our lease lapsed meanwhile)
    UNCONFIGURED = "unconfigured"  # no adapter: back to pending, attempt given back
    FATAL = "fatal"  # out of memory: back to pending, attempt given back, run stops
    RATE_LIMITED = "rate_limited"  # no slot, or a provider's pacing: attempt given back
    WAITING = "waiting"  # its destination is failing: held, attempt given back
    NOT_SENT = "not_sent"  # the limiter failed before the request left: attempt given back
    DISABLED = "disabled"  # its destination is disabled: failed, nothing sent
    PAUSED = "paused"  # its destination is paused: held until the pause ends, attempt given back


# What the drain reports for each row of the policy.
_SEND_OUTCOMES = {
    DeliveryOutcome.ACKED: SendOutcome.ACKED, DeliveryOutcome.PERMANENT: SendOutcome.FAILED,
    DeliveryOutcome.TRANSIENT: SendOutcome.RETRY, DeliveryOutcome.LAST_ATTEMPT: SendOutcome.GAVE_UP,
    DeliveryOutcome.DESTINATION_FAILING: SendOutcome.WAITING,
    DeliveryOutcome.DESTINATION_HELD: SendOutcome.WAITING,
    DeliveryOutcome.PACING_PAST_CAP: SendOutcome.WAITING, DeliveryOutcome.NO_SLOT: SendOutcome.RATE_LIMITED,
    DeliveryOutcome.PACING: SendOutcome.RATE_LIMITED, DeliveryOutcome.UNKNOWN: SendOutcome.UNKNOWN,
    DeliveryOutcome.UNKNOWN_RESTS: SendOutcome.UNKNOWN, DeliveryOutcome.NOT_SENT: SendOutcome.NOT_SENT,
    DeliveryOutcome.NO_ADAPTER: SendOutcome.UNCONFIGURED, DeliveryOutcome.FATAL: SendOutcome.FATAL,
    DeliveryOutcome.DESTINATION_GONE: SendOutcome.DISABLED,
    DeliveryOutcome.DESTINATION_STALE: SendOutcome.DISABLED,
    DeliveryOutcome.DESTINATION_DISABLED: SendOutcome.DISABLED,
    DeliveryOutcome.DESTINATION_PAUSED: SendOutcome.PAUSED}
# The summary key each outcome of a send adds one to.
_COUNTED = {SendOutcome.ACKED: "recovered", SendOutcome.FAILED: "failed",
            SendOutcome.GAVE_UP: "skippedMaxRetries", SendOutcome.UNKNOWN: "unknown",
            SendOutcome.RATE_LIMITED: "rateLimited", SendOutcome.DISABLED: "failedDisabled",
            SendOutcome.PAUSED: "paused"}
# A run holds at most CLAIM_BATCH claimed entries, split among its workers (each claim takes
# CLAIM_BATCH // workers, at least PER_ROUND): one worker never holds a batch the others
# could be sending. A claim takes at least PER_ROUND of one receiver a turn, more when
# fewer receivers wait than the claim takes (the store's claim).
CLAIM_BATCH = 32
PER_ROUND = 4
# While a worker's claims come back full and its batch went out within FAST_BATCH_S, its
# next claim takes twice as many, up to CLAIM_MAX: a long backlog of fast sends shares
# each commit among more entries; a short backlog, or slow sends, keep the split above.
CLAIM_MAX = 256
FAST_BATCH_S = 1.0
# With nothing to claim while a receiver waits for its next rate slot, the run looks again
# after at most this long (new entries are claimed meanwhile).
IDLE_POLL_S = 1.0


class Sent(NamedTuple):
    """What one send came to, before it is settled."""

    verdict: str  # acked | permanent | transient | fatal
    duration_ms: int
    message_id: str | None = None
    error: BaseException | None = None


class _Decided(NamedTuple):
    """What the policy decided for one entry of a round, settled with the round."""

    settle: Settle
    outcome: DeliveryOutcome


class DrainSummary(TypedDict):
    recovered: int
    failed: int
    skippedMaxRetries: int
    deferredBackoff: int
    expired: int
    expiredWaiting: dict[str, int]
    unknown: int
    leftDue: int
    unconfigured: dict[str, Any]
    outages: dict[str, Any]
    rateLimited: int
    notSent: int
    notSentError: str | None
    fatal: int
    fatalError: str | None
    disabled: dict[str, str]
    failedDisabled: int
    paused: int


def receiver_of(entry: DeliveryEntry) -> str:
    """Where the entry's rates and outages live (its key column; an entry stored before
    the keys were, its destination, else its channel)."""
    return entry.receiver or entry.destination or entry.channel


def check_enqueue(channel: str, payload: Any) -> None:
    """A channel Sluice has and a payload it can send: ``RequestError`` (400) naming the field."""
    if channel not in channels():
        raise RequestError(f"unknown channel {channel!r}; known: {', '.join(channels())}",
                           field="channel")
    parse(channel, payload)


class Deliverer:
    def __init__(self, store: DeliveryStore, adapters: Mapping[str, ChannelAdapter], *,
                 lease: timedelta, send_timeout_s: float = 10.0,
                 expire: timedelta = timedelta(days=1), outage_threshold: int = 3,
                 reporter: Reporter | None = None, limiter: Limiter | None = None,
                 clock: Callable[[], float] = time.monotonic, concurrency: int = 1,
                 idle: Callable[[float], None] = sleep_with_abort) -> None:
        store.policy = store.policy.knowing(deduplicating())
        self.store = store
        self.policy = store.policy
        self.adapters = adapters
        self.lease = lease
        self.send_timeout_s = send_timeout_s
        self.expire = expire
        self.destinations = Destinations(store.db, outage_threshold, self.policy)
        self.chunks = ChunkLog(store.db)
        self.reporter = reporter
        self.limiter = limiter
        self.clock = clock
        self.concurrency = concurrency  # sends a drain run keeps in flight at once
        self.idle = idle  # a run's wait for a receiver's next rate slot (ends on shutdown)

    @classmethod
    def from_services(cls, services: Services, client: Outbound, *,
                      deadline: Deadline | None = None,
                      sleep: Callable[[float], None] | None = None,
                      policy: RetryPolicy = DEFAULT_POLICY,
                      limiter: Limiter | None = None) -> Deliverer:
        """Adapters retry in-process on ``policy``, never waiting past ``deadline``; the
        rates shared with every other sender are the limiter's (Redis, else the database)."""
        settings = services.settings
        limiter = limiter or Limiter.from_services(services)
        # a send waits in process at most the rate wait (a slot, a provider's named wait):
        # longer, its entry and receiver are set aside until then, and the run goes on
        policy = policy._replace(max_delay_s=min(policy.max_delay_s,
                                                 settings.delivery_rate_wait_s))
        retrier = Retrier(policy, sleep=sleep or SLEEP,
                          remaining=deadline.remaining if deadline else None,
                          reserve_s=settings.delivery_send_timeout_s,
                          on_retry=limiter.on_retry,
                          before_retry=lambda: limiter.further("retry"))
        store = DeliveryStore(services.db, policy=Policy.from_settings(settings))
        return cls(store, build_adapters(settings, client, retrier),
                   lease=timedelta(seconds=settings.delivery_lease_s),
                   send_timeout_s=settings.delivery_send_timeout_s,
                   expire=timedelta(seconds=settings.delivery_expire_s),
                   outage_threshold=settings.delivery_outage_threshold,
                   reporter=services.reporter,
                   limiter=limiter, concurrency=settings.delivery_drain_concurrency)

    # --- one entry -----------------------------------------------------------------

    def deliver(self, channel: str, recipient: str, payload: dict[str, Any], *,
                idempotency_key: str | None = None,
                subject_user_id: str | None = None) -> tuple[DeliveryEntry, SendOutcome | None]:
        """Check, enqueue, send, settle. With a key already stored, nothing is sent again:
        ``(that entry, None)``."""
        check_enqueue(channel, payload)
        recipient = check_recipient(channel, recipient, field="recipient")
        entry, created = self.store.enqueue(channel, recipient, payload,
                                            idempotency_key=idempotency_key,
                                            subject_user_id=subject_user_id, lease=self.lease)
        if not created:
            return entry, None
        crash_point("delivery.after_enqueue")
        outcome = self.attempt(entry)
        return self.store.get(entry.id), outcome

    def attempt(self, entry: DeliveryEntry) -> SendOutcome:
        """Send one claimed (``in_flight``) entry and settle it, outside a drain: a
        transient failure is the entry's own unless the policy charges the destination."""
        return _Run(self, None, lambda message: None).one(entry)

    def _send(self, adapter: ChannelAdapter, entry: DeliveryEntry,
              time_left: Callable[[], float] | None = None) -> Sent:
        started = self.clock()
        # a message in chunks resumes after those accepted, each further chunk with its slot
        progress = SendProgress(self.chunks, entry, self.limiter)
        try:
            if self.limiter is not None:
                # every request after the send's first (a chunk, a retry) takes a slot
                with self.limiter.sending(entry, time_left):
                    message_id = adapter.send(entry, progress)
            else:
                message_id = adapter.send(entry, progress)
        except Exception as exc:  # noqa: BLE001 - the guard: any adapter error settles the entry
            # (a malformed recipient's ValueError is the entry's permanent failure: classify)
            return Sent(classify(exc), self._ms(started), error=exc)
        crash_point("delivery.after_send")
        return Sent("acked", self._ms(started), message_id)

    def _ms(self, started: float) -> int:
        return int((self.clock() - started) * 1000)

    # --- the drain -----------------------------------------------------------------

    def drain(self, deadline: Deadline,
              progress: Callable[[str], None] = lambda message: None) -> DrainSummary:
        return _Run(self, deadline, progress).run()


class _Run:
    """One drain (or one inline send, without a deadline): the summary, and what this run
    learnt of receivers (held, paced) so that the rest of a claimed batch is set aside
    without a request."""

    def __init__(self, deliverer: Deliverer, deadline: Deadline | None,
                 progress: Callable[[str], None]) -> None:
        self.d = deliverer
        self.store = deliverer.store
        self.policy = deliverer.policy
        self.destinations = deliverer.destinations
        self.deadline = deadline
        self.progress = progress
        self.summary = DrainSummary(recovered=0, failed=0, skippedMaxRetries=0,
                                    deferredBackoff=0, expired=0, expiredWaiting={},
                                    unknown=0, leftDue=0,
                                    unconfigured={"count": 0, "channels": {}},
                                    outages={"count": 0, "down": {}, "destinations": []},
                                    rateLimited=0, notSent=0, notSentError=None, fatal=0,
                                    fatalError=None, disabled={}, failedDisabled=0, paused=0)
        # receivers this run found failing, or without a slot until a time
        self.failing: dict[str, FailingDestination] = {}
        self.paced: dict[str, datetime] = {}
        self.up: set[str] = set()  # receivers that took an entry during this run
        self.after = ""  # the last receiver served: the next claim starts after it
        self.stopped = threading.Event()
        self.exhausted = 0  # workers that found nothing more to claim
        # the summary and the receivers above, when several workers send at once
        self.lock = threading.RLock()
        self.claiming = threading.Lock()
        self.batch = max(PER_ROUND, CLAIM_BATCH // max(1, self.d.concurrency))

    def run(self) -> DrainSummary:
        started: datetime = utcnow()
        summary = self.summary
        pauses, released = self.destinations.lapse(now=started)
        if pauses:
            logger.info(f"[delivery] {pauses} destination pauses ended; {released} entries "
                        "are due again")
        failing_before = set(self.destinations.load())
        expired = self.store.expire(self.d.expire, now=started)
        summary["expired"] = sum(expired.values())
        summary["failed"] += summary["expired"]
        summary["expiredWaiting"] = {key: n for key, n in sorted(expired.items())
                                     if key in failing_before}
        if expired:
            logger.warning(f"[delivery] {summary['expired']} entries expired undelivered "
                           f"(older than {int(self.d.expire.total_seconds())} s); waiting "
                           f"on a failing receiver: {summary['expiredWaiting']}")
        back, unknown, lost = self.store.recover()
        summary["unknown"] += unknown
        summary["failed"] += lost
        if back or unknown or lost:
            logger.info(f"[delivery] lapsed leases: {back} back to pending, {unknown} "
                        f"resting unknown (each may have been sent), {lost} failed unsent "
                        "(their senders died before sending them, too often in a row)")
        set_aside = self.store.hold_unconfigured(sorted(self.d.adapters))
        summary["unconfigured"] = {"count": sum(set_aside.values()), "channels": {
            channel: f"no adapter configured for channel {channel!r}" for channel in set_aside}}
        summary["failedDisabled"] += sum(self.destinations.fail_disabled(now=started).values())
        if self.d.concurrency <= 1:
            self._work()
        else:
            self._in_parallel(self.d.concurrency)
        summary["deferredBackoff"] = self.store.count_backoff(since=started)
        # due entries the run left at its deadline or shutdown; a run whose every worker
        # found nothing more to claim left none (what waits on a pause, a probe or a slot
        # is not due to it)
        workers = max(1, self.d.concurrency)
        summary["leftDue"] = 0 if self.exhausted >= workers else self.store.count_due()
        summary["paused"] += self.destinations.paused_waiting()
        destinations = self.destinations.status()
        summary["outages"]["destinations"] = destinations
        summary["outages"]["down"] = {
            d["key"]: f"{d['failures']} transient failures in a row since {d['downSince']}; "
                      f"{d['waiting']} entries waiting; last: {d['lastError']}"
            for d in destinations if d["down"]}
        return summary

    def _time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline.remaining()

    def _going(self) -> bool:
        assert self.deadline is not None
        return (not self.stopped.is_set() and not SHUTDOWN.is_set()
                and self.deadline.remaining() > self.d.send_timeout_s)

    def _work(self) -> None:
        """Claim a batch in turns across receivers, send and settle it a round at a time
        (``_send_round``), and again,
        until none is due, the deadline nears (a whole send, its timeout, must still fit)
        or the run must stop: this run's own stop, or the process's shutdown (SIGTERM,
        Ctrl-C), after which nothing more is claimed or sent and what is due waits for the
        next run (``leftDue``). With nothing to claim while a receiver's backlog waits only
        for its next rate slot, the run waits for that slot within its budget."""
        summary = self.summary
        size = self.batch
        while self._going():
            with self.claiming:
                at = utcnow()
                claimed = self.store.claim(self.d.lease, limit=size,
                                           per_round=PER_ROUND, after=self.after,
                                           channels=sorted(self.d.adapters), now=at)
                if claimed:
                    self.after = max(e.receiver or "" for e in claimed)
            if not claimed:
                if self._idle(at):
                    continue
                with self.lock:
                    self.exhausted += 1  # nothing more this worker could claim
                break
            crash_point("delivery.after_claim")
            began = self.d.clock()
            # receivers this batch found without a slot: their later entries in it wait
            # behind the one set aside (a slot that frees meanwhile must not let a later
            # entry overtake it: the receiver is paced, its entries keep their order)
            paced: set[str] = set()
            rest = claimed
            while rest:
                if not self._going() or self._lease_short(rest[0]):
                    self._settle([self._not_sent(entry) for entry in rest])
                    return
                batch, rest = self._round(rest)
                for outcome in self._send_round(batch, paced):  # (it stops the run on a fatal)
                    self._count(outcome)
                self.progress(f"delivery-drain: {summary['recovered']} delivered, "
                              f"{summary['failed'] + summary['skippedMaxRetries']} failed")
            size = (min(2 * size, CLAIM_MAX)
                    if len(claimed) >= size and self.d.clock() - began < FAST_BATCH_S
                    else self.batch)

    def _lease_short(self, entry: DeliveryEntry) -> bool:
        """The sends before it in its batch took half its lease (or its whole send's time):
        it waits for another claim rather than risk a send past its lease."""
        if entry.lease_until is None:
            return False
        left = (entry.lease_until - utcnow()).total_seconds()
        return left < min(self.d.send_timeout_s, self.d.lease.total_seconds() / 2)

    def _idle(self, at: datetime) -> bool:
        """Wait for the next rate slot of a receiver with due entries, if it comes within
        this run's budget (no wait past one poll, so new entries are claimed meanwhile);
        False when nothing is coming. ``at`` is the empty claim's time: a slot that came
        after it (the wait ended a hair before the slot, by the clock the claim read) is
        still coming, and is claimed next."""
        ready = self.destinations.next_ready(now=at)
        left = self._time_left()
        if ready is None or left is None:
            return False
        wait = (ready - utcnow()).total_seconds()
        if wait >= left - self.d.send_timeout_s:
            return False
        self.d.idle(min(max(wait, 0.01), IDLE_POLL_S))
        return not SHUTDOWN.is_set()

    def _in_parallel(self, workers: int) -> None:
        """``workers`` threads each running ``_work``: the waits on the network, the store
        and the rates overlap. Claims stay exclusive and every settle is guarded, so no
        entry is sent twice; the first thing a worker raises stops the others and is raised
        here. Each worker runs in a copy of this context (the statement bound of the job's
        time left goes with it)."""
        raised: list[BaseException] = []

        def work() -> None:
            try:
                self._work()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                raised.append(exc)
                self.stopped.set()

        threads = [threading.Thread(target=contextvars.copy_context().run, args=(work,),
                                    name=f"delivery-drain-{n}", daemon=True)
                   for n in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if raised:
            raise raised[0]

    def one(self, entry: DeliveryEntry) -> SendOutcome:
        """Send and settle one claimed entry (a round of one)."""
        [outcome] = self._send_round([entry], set())
        return outcome

    def _round(self, entries: list[DeliveryEntry]) -> tuple[list[DeliveryEntry],
                                                           list[DeliveryEntry]]:
        """The entries of a batch that go out in one round, and the rest: no two of a
        round share a rate key, so each key's sends stay one at a time, each taking its
        slot just before it leaves (the rates' spacing); entries without rates all go."""
        limiter = self.d.limiter
        if limiter is None:
            return entries, []
        taken: set[str] = set()
        now: list[DeliveryEntry] = []
        later: list[DeliveryEntry] = []
        for entry in entries:
            keys = ({rate.key for rate in limiter.rates(entry)}
                    if entry.channel in self.d.adapters else set())
            if keys & taken:
                later.append(entry)
            else:
                taken |= keys
                now.append(entry)
        return now, later

    def _send_round(self, entries: list[DeliveryEntry], paced: set[str]) -> list[SendOutcome]:
        """One round: what can go is marked leaving in one statement (write-ahead: the
        mark commits before any request leaves, and reads its destinations' pause and
        disable), then each is sent, and the round's outcomes settle in one commit after
        the last send returned (none before its own send returned). A failure settles what
        the round decided before it first, as if sent one at a time (its receiver's
        streak reads their outcomes). A crash in the round leaves its marked entries
        in flight: their leases lapse to an unknown outcome, and at most they are sent
        again. ``paced``: the receivers of the batch that found no slot (their later
        entries wait behind the one set aside); this round's add to it."""
        decided: list[_Decided] = []
        outcomes: list[SendOutcome] = []
        leaving: list[tuple[DeliveryEntry, ChannelAdapter, str]] = []
        for entry in entries:
            adapter = self.d.adapters.get(entry.channel)
            receiver = receiver_of(entry)
            if adapter is None:
                decided.append(self._decide(
                    entry, DeliveryOutcome.NO_ADAPTER,
                    f"waiting: no adapter configured for channel {entry.channel!r}",
                    held_by=f"{UNCONFIGURED}{entry.channel}"))
                continue
            held = self._held(entry, receiver, paced)
            if held is not None:
                decided.append(held)
                if _SEND_OUTCOMES[held.outcome] is SendOutcome.RATE_LIMITED:
                    paced.add(receiver)
                continue
            leaving.append((entry, adapter, receiver))
        marked = self.store.requests_left([entry for entry, _, _ in leaving])
        try:
            for n, (entry, adapter, receiver) in enumerate(leaving):
                if entry.id not in marked:
                    stopped = self._stopped(entry)
                    if stopped is None:
                        outcomes.append(SendOutcome.STALE)
                    else:
                        decided.append(stopped)
                    continue
                if self.deadline is not None and (not self._going()
                                                  or self._lease_short(entry)):
                    decided.append(self._not_sent(entry))
                    continue
                step = self._held(entry, receiver, paced) or self._slot(entry, receiver)
                if step is None:
                    with _attempt_span(entry, receiver) as span:
                        sent = self._sent(adapter, entry)
                        if sent.verdict != "acked":
                            outcomes += self._settle(decided)
                            decided = []
                        try:
                            step = self._conclude(entry, sent)
                        except StoreError:
                            raise
                        except Exception as exc:  # noqa: BLE001 - one entry's own failure
                            logger.error(f"[delivery] {entry.id} raised while settled: {exc!r}")
                            step = self._conclude(entry, Sent(classify(exc), 0, error=exc))
                        span.set("sluice.outcome", step.outcome.value)  # the policy's row
                decided.append(step)
                if _SEND_OUTCOMES[step.outcome] is SendOutcome.RATE_LIMITED:
                    paced.add(receiver)
                if step.outcome in (DeliveryOutcome.FATAL, DeliveryOutcome.NOT_SENT):
                    self.stopped.set()  # the run stops: the rest of the round is not sent
        except StoreError:
            # the store failed: what the round decided, and its marked entries not yet
            # sent (given back), settle if the store answers; else their leases lapse
            done = {d.settle.entry.id for d in decided}
            unsent = [self._not_sent(entry) for entry, _, _ in leaving[n + 1:]
                      if entry.id in marked and entry.id not in done]
            with contextlib.suppress(StoreError):
                self._settle(decided + unsent)
            raise
        return outcomes + self._settle(decided)

    def _held(self, entry: DeliveryEntry, receiver: str, paced: set[str]) -> _Decided | None:
        """In a drain, an entry of a receiver this run found failing or without a slot is
        set aside unsent (None: it may go); one behind an entry of its batch that found no
        slot waits behind it, in order."""
        if self.deadline is None:
            return None
        if receiver in paced:
            return self._behind(entry, receiver)
        with self.lock:
            known = self.failing.get(receiver)
            slot = self.paced.get(receiver)
        if known is not None:
            return self._wait(entry, DeliveryOutcome.DESTINATION_HELD, known)
        now = utcnow()
        if slot is not None and slot > now:
            return self._decide(entry, DeliveryOutcome.NO_SLOT,
                                f"not sent yet: {receiver} has no rate slot before "
                                f"{iso_z(slot)}", wait=slot - now, now=now)
        return None

    def _behind(self, entry: DeliveryEntry, receiver: str) -> _Decided:
        """An earlier entry of ``receiver`` in this batch found no slot: this one is set
        aside behind it, unsent (it keeps its place, so the two go in order)."""
        now = utcnow()
        with self.lock:
            slot = self.paced.get(receiver)
        wait = max(slot - now, timedelta(0)) if slot is not None else timedelta(0)
        return self._decide(entry, DeliveryOutcome.NO_SLOT,
                            f"not sent yet: an earlier entry of {receiver} waits for its "
                            "rate slot", wait=wait, now=now)

    def _not_sent(self, entry: DeliveryEntry) -> _Decided:
        return self._decide(entry, DeliveryOutcome.NOT_SENT,
                            "not sent: the run stopped before its turn")

    def _stopped(self, entry: DeliveryEntry) -> _Decided | None:
        """The mark refused the entry: an operator paused or disabled its destination or
        receiver since the claim (settled so, nothing sent), or it is no longer this
        attempt's (None: stale)."""
        now = utcnow()
        stop = self.destinations.stop(entry, now=now)
        if stop is None:
            return None
        outcome, control = stop
        if outcome is DeliveryOutcome.DESTINATION_DISABLED:
            return self._decide(entry, outcome, f"not sent: destination {control.key} is "
                                                f"disabled since "
                                                f"{iso_z_or_none(control.disabled_at)}: "
                                                f"{control.disabled_reason}")
        assert control.paused_until is not None
        return self._decide(entry, DeliveryOutcome.DESTINATION_PAUSED,
                            f"waiting: destination {control.key} is paused until "
                            f"{iso_z(control.paused_until)}", wait=control.paused_until - now)

    def _disable(self, entry: DeliveryEntry, key: str, outcome: DeliveryOutcome,
                 error: str | None, since: datetime | None) -> None:
        """The policy disables ``key`` (the destination is gone, or the receiver failed past
        the limit): its pending entries fail at once, later ones at the next drain, and the
        disable pages."""
        if outcome is DeliveryOutcome.DESTINATION_GONE:
            reason = f"gone: {error}"
        else:
            reason = (f"failing without a success since {iso_z(since) if since else '?'} "
                      f"(SLUICE_DESTINATION_DISABLE_AFTER); last: {error}")
        failed = self.destinations.disable(key, reason)
        with self.lock:
            self.summary["disabled"][key] = reason
            self.summary["failedDisabled"] += failed
            self.failing.pop(key, None)
        logger.error(f"[delivery] destination {key} disabled: {reason}; {failed} waiting "
                     "entries failed destination_disabled (enable it, then redrive them)")
        if self.d.reporter is not None:
            self.d.reporter.error("delivery-drain", DestinationDisabled(
                f"delivery destination {key} disabled: {reason}", destination=key),
                destination=key, entry=entry.id)

    def _slot(self, entry: DeliveryEntry, receiver: str) -> _Decided | None:
        """Take the entry's rate slot (marked leaving already): None when it may go now,
        else the entry set aside unsent (no slot, or the limiter failed)."""
        limiter = self.d.limiter
        if limiter is not None:
            # a run never sleeps for one receiver's slot while others may have work: no
            # slot now paces the receiver and the run goes on (``_idle`` waits when nothing
            # else can go); an inline send waits up to the rate wait
            try:
                wait_s = limiter.acquire(entry, time_left_s=None if self.deadline is None
                                         else 0.0)
            except StoreError as exc:  # the limiter is down: nothing left, nothing counts
                with self.lock:
                    self.summary["notSent"] += 1
                    self.summary["notSentError"] = describe(exc)
                logger.warning(f"[delivery] {entry.id} not sent: the rate limiter failed "
                               f"({describe(exc)}); back with its attempt, the run stops")
                return self._decide(entry, DeliveryOutcome.NOT_SENT,
                                    f"not sent: the rate limits' store failed ({describe(exc)})")
            if wait_s > 0:
                at = self._paced(receiver, wait_s)
                return self._decide(entry, DeliveryOutcome.NO_SLOT,
                                    f"not sent yet: {entry.channel} rate limit",
                                    wait=timedelta(seconds=wait_s), now=at)
        return None

    def _sent(self, adapter: ChannelAdapter, entry: DeliveryEntry) -> Sent:
        """Send the entry: what the send came to."""
        deadline = self.deadline
        try:
            return self.d._send(adapter, entry, None if deadline is None
                                else lambda: deadline.remaining() - self.d.send_timeout_s)
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever one entry raises is its own failure
            logger.error(f"[delivery] {entry.id} raised while being sent: {exc!r}")
            return Sent(classify(exc), 0, error=exc)

    def _paced(self, receiver: str, wait_s: float) -> datetime:
        """Nothing of ``receiver`` is claimed for ``wait_s`` from now; that now, for the
        entry set aside with it: due exactly when its receiver is ready, so ``next_ready``
        sees it waiting for that slot (a moment later, and a run whose only entry of the
        receiver it is would end instead of waiting for the slot)."""
        now = utcnow()
        until = now + timedelta(seconds=wait_s)
        with self.lock:
            self.paced[receiver] = until
        self.destinations.paced(receiver, until, now=now)
        return now

    def _conclude(self, entry: DeliveryEntry, sent: Sent) -> _Decided:
        """Settle what a send came to, as the policy decides, from what its receiver's
        streak says of whose failure it is."""
        receiver = receiver_of(entry)
        streak = Streak(None, None)
        if sent.verdict == "transient":
            streak = self.destinations.streak(receiver)
            with self.lock:
                if streak.failing is None and receiver in self.failing:
                    streak = streak._replace(failing=self.failing[receiver])
        known = streak.failing
        outcome = self.policy.after_send(
            sent.verdict, sent.error, channel=entry.channel, attempts=entry.attempts,
            unknown_sends=entry.unknown_sends, receiver_failing=known is not None,
            another_failed=streak.suspect not in (None, entry.id),
            failing_since=known.down_since if known else None, now=utcnow())
        error = describe(sent.error) if sent.error is not None else None
        if outcome is DeliveryOutcome.DESTINATION_GONE:
            self._disable(entry, entry.destination or receiver, outcome, error, None)
            return self._decide(entry, outcome, f"destination disabled: {error}",
                               duration_ms=sent.duration_ms)
        if outcome is DeliveryOutcome.DESTINATION_STALE:
            self._disable(entry, receiver, outcome, error, known.down_since if known else None)
            return self._decide(entry, outcome, f"destination disabled: {error}",
                               duration_ms=sent.duration_ms)
        if outcome is DeliveryOutcome.FATAL:
            with self.lock:
                self.summary["fatal"] = 1
                self.summary["fatalError"] = error or "fatal"
            if self.d.reporter is not None and sent.error is not None:
                self.d.reporter.error("delivery-drain", sent.error, entry=entry.id)
            return self._decide(entry, outcome, f"not sent: the sender stopped: {error}")
        if outcome in (DeliveryOutcome.DESTINATION_FAILING, DeliveryOutcome.PACING_PAST_CAP):
            assert error is not None and sent.error is not None
            asked = retry_after_s(sent.error) if outcome is DeliveryOutcome.DESTINATION_FAILING else None
            with self.lock:  # one worker at a time counts a receiver's failures
                found = self.destinations.failed(receiver, error, known=known, asked_s=asked)
                self.failing[receiver] = found
            if known is None and streak.suspect not in (None, entry.id):
                assert streak.suspect is not None  # the outage began with another's failure
                self.destinations.spread(streak.suspect)
            if self.destinations.reported(found):
                logger.warning(f"[delivery] {receiver} is down ({found.failures} failures in a "
                               f"row; last: {found.last_error}); its entries wait, no attempt "
                               "counted")
            return self._wait(entry, outcome, found)
        if outcome is DeliveryOutcome.NO_SLOT:  # a further chunk found no slot in time
            assert sent.error is not None
            wait_s = retry_after_s(sent.error) or 0.0
            at = self._paced(receiver, wait_s)
            return self._decide(entry, outcome, error, wait=timedelta(seconds=wait_s), now=at)
        if outcome is DeliveryOutcome.PACING:
            assert sent.error is not None
            wait_s = pacing_s(sent.error) or 0.0
            if self.d.limiter is not None:
                self.d.limiter.slow_down(entry, wait_s)
            at = self._paced(receiver, wait_s)  # a probe's next one waits for it too
            return self._decide(entry, outcome, f"not sent: {error} (rate limited; "
                               "no attempt counted)", wait=timedelta(seconds=wait_s), now=at)
        if outcome is DeliveryOutcome.ACKED:
            with self.lock:
                first = receiver not in self.up
                self.up.add(receiver)
                back = self.failing.pop(receiver, None) is not None
            if first or back:
                self.destinations.up(receiver)
            if back:
                logger.info(f"[delivery] {receiver} is back")
        if outcome in (DeliveryOutcome.TRANSIENT, DeliveryOutcome.LAST_ATTEMPT):
            self.destinations.suspect(receiver, entry.id)
        if outcome in (DeliveryOutcome.PERMANENT, DeliveryOutcome.LAST_ATTEMPT, DeliveryOutcome.TRANSIENT,
                       DeliveryOutcome.UNKNOWN, DeliveryOutcome.UNKNOWN_RESTS):
            logger.warning(f"[delivery] {entry.channel} {entry.id} attempt {entry.attempts} "
                           f"failed: {error}", extra={"outcome": outcome.value})
        return self._decide(entry, outcome, error, duration_ms=sent.duration_ms,
                            message_id=sent.message_id)

    def _wait(self, entry: DeliveryEntry, outcome: DeliveryOutcome,
              destination: FailingDestination) -> _Decided:
        """Set aside for its failing receiver: due again at the receiver's next probe, so
        the entry just tried goes behind those that waited (the probes go round them)."""
        with self.lock:
            self.summary["outages"]["count"] += 1
        return self._decide(
            entry, outcome, f"waiting: {destination.key} is failing since "
                            f"{destination.down_since.isoformat()} ({destination.failures} "
                            f"in a row; last: {destination.last_error})",
            wait=max(destination.next_probe_at - utcnow(), timedelta(0)))

    def _decide(self, entry: DeliveryEntry, outcome: DeliveryOutcome, error: str | None, *,
                wait: timedelta | None = None, held_by: str | None = None,
                duration_ms: int | None = None, message_id: str | None = None,
                now: datetime | None = None) -> _Decided:
        """The policy's decision for ``outcome``, to be settled with its round."""
        decision = self.policy.decide(outcome, attempts=entry.attempts, wait=wait)
        return _Decided(Settle(entry, decision, error, duration_ms=duration_ms,
                               message_id=message_id, held_by=held_by, now=now), outcome)

    def _settle(self, decided: list[_Decided]) -> list[SendOutcome]:
        """Settle what a round decided, in one commit: each entry's outcome, or ``STALE``
        when it was no longer ours (its lease lapsed)."""
        settled = self.store.settle([d.settle for d in decided])
        outcomes = []
        for d, ours in zip(decided, settled, strict=True):
            if not ours and d.outcome is DeliveryOutcome.ACKED:
                logger.warning(f"[delivery] {d.settle.entry.id} was sent but its lease had "
                               "lapsed; another attempt may send it again")
            outcomes.append(_SEND_OUTCOMES[d.outcome] if ours else SendOutcome.STALE)
        return outcomes

    def _count(self, outcome: SendOutcome) -> None:
        key = _COUNTED.get(outcome)
        if key is not None:
            with self.lock:
                self.summary[key] += 1  # type: ignore[literal-required]


def _attempt_span(entry: DeliveryEntry, receiver: str) -> AbstractContextManager[trace.Span]:
    """One send attempt's span: in the trace of the span that enqueued the entry, and
    linked to it and to the drain run that sent it."""
    if not trace.enabled():
        return trace.OFF
    enqueued = trace.loaded(entry.trace_context)
    destination = entry.destination or receiver
    return trace.span(f"deliver {destination}", kind="consumer", parent=enqueued,
                      links={"enqueue": enqueued, "drain": trace.carrier()} if enqueued else None,
                      attributes={"messaging.system": SYSTEM_SLUICE,
                                  "messaging.operation.type": "process",
                                  "messaging.operation.name": "deliver",
                                  "messaging.destination.name": destination,
                                  "messaging.message.id": entry.id, "sluice.entry_id": entry.id,
                                  "sluice.destination": destination, "sluice.receiver": receiver,
                                  "sluice.channel": entry.channel, "sluice.attempt": entry.attempts})


def report_drained(summary: DrainSummary, reporter: Reporter) -> None:
    """The ``queue_drained`` log record and metrics, after every drain."""
    logger.info("queue_drained", extra={"event": "queue_drained", "summary": dict(summary)})
    reporter.metrics({f"QueueDrained.{key}": float(value) for key, value in summary.items()
                      if isinstance(value, int)} | {
        "QueueDrained.unconfigured": float(summary["unconfigured"]["count"]),
        "QueueDrained.outages": float(summary["outages"]["count"]),
        "QueueDrained.destinationsDown": float(len(summary["outages"]["down"])),
        "QueueDrained.destinationsDisabled": float(len(summary["disabled"])),
        "QueueDrained.expiredWaiting": float(sum(summary["expiredWaiting"].values()))},
        event="queue_drained")


def run_delivery_drain(ctx: JobContext) -> dict[str, Any]:
    settings = ctx.services.settings
    with (trace.span("drain delivery", attributes={"sluice.job": "delivery-drain"}) as span,
          Outbound.open(settings, deadline_s=ctx.deadline.remaining()) as client):
        deliverer = Deliverer.from_services(ctx.services, client, deadline=ctx.deadline)
        summary = deliverer.drain(ctx.deadline, ctx.progress)
        for key in ("recovered", "failed", "unknown", "rateLimited", "leftDue"):
            span.set(f"sluice.drain.{key}", summary[key])
    report_drained(summary, ctx.services.reporter)
    pruned = deliverer.store.prune(utcnow() - timedelta(days=settings.delivery_retention_days))
    if pruned:
        logger.info(f"[delivery] pruned {pruned} settled entries older than "
                    f"{settings.delivery_retention_days} days")
    return dict(summary)


__all__ = ["Deliverer", "DrainSummary", "SendOutcome", "check_enqueue", "report_drained",
           "run_delivery_drain"]
