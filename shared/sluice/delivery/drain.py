"""Sending from the delivery queue: the inline path and the ``delivery-drain`` job.

Inline, ``Deliverer.deliver`` stores the entry (``in_flight``, attempt 1, under a
lease) before it calls the adapter, then settles it. If the process dies between
the two, the lease lapses and the next drain sends it: at-least-once, and a
webhook receiver can drop the duplicate by its ``Idempotency-Key``.

The drain fails pending entries past the expiry (reason ``expired``), returns
lapsed leases to ``pending`` (an unknown outcome: see below), then claims due entries
one at a time and sends each, until none is due or the deadline is near (with
``delivery_drain_concurrency`` above 1, that many workers do so at once); finally it
prunes settled entries past their retention (their effect records stay). What is not
the entry's fault never costs it an attempt: an entry whose channel has no adapter
(configuration), an entry whose destination is down (``sluice.delivery.destinations``:
it waits, one probe per backoff step, until it expires), and the entry being sent when
the process ran out of memory (the run stops) all go back to ``pending`` with the
attempt returned. A send that timed out after the request went out is *unknown*: it
counts as an attempt, is never resent in-process, and is resent later only as its
channel allows (``DeliveryStore.nack``). One malformed entry (a recipient that does
not parse) is that entry's permanent failure; the run goes on.

Its result (the keys a scheduler or an alarm reads, stable across versions):

- ``recovered``: entries delivered (acked) by this run;
- ``failed``: entries failed for good by this run (a permanent error, or ``expired``);
- ``skippedMaxRetries``: entries failed by this run because their last attempt (the
  fifth) failed transiently;
- ``deferredBackoff``: entries this run skipped because they were still in backoff;

and beside it ``expired``, ``unknown`` (sends of this run, and lapsed leases, whose
outcome is unknown), ``leftDue`` (due, not reached before the deadline),
``unconfigured``, ``outages`` (``count``: entries that waited on a destination this
run; ``down``: each destination reported down, with why; ``destinations``: every
failing destination with its entries waiting), ``rateLimited`` (entries set aside, their
attempt given back, because a rate shared by every sender had no slot or the provider
answered 429; see ``sluice.delivery.ratelimit``), and ``fatal`` (1 when the run stopped
out of memory, with ``fatalError``).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple, TypedDict

from sluice.core.crash import crash_point
from sluice.core.errors import RequestError, StoreError
from sluice.core.observe import Reporter, logger
from sluice.core.services import Services
from sluice.core.shutdown import sleep_with_abort
from sluice.core.validate import check_recipient
from sluice.delivery.channels import (
    ChannelAdapter,
    Outbound,
    build_adapters,
    channels,
    deduplicating,
)
from sluice.delivery.chunks import ChunkLog, SendProgress
from sluice.delivery.classify import (
    CredentialsRefused,
    MissingAdapter,
    classify,
    describe,
    is_unknown,
    retry_after_s,
)
from sluice.delivery.destinations import Destinations, FailingDestination
from sluice.delivery.payload import parse
from sluice.delivery.ratelimit import Limiter
from sluice.delivery.retry import DEFAULT_POLICY, Retrier, RetryPolicy
from sluice.delivery.store import DeliveryEntry, DeliveryStatus, DeliveryStore
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
    RATE_LIMITED = "rate_limited"  # no slot, or a 429: back to pending, attempt given back


class Sent(NamedTuple):
    """What one send came to, before it is settled."""

    verdict: str  # acked | permanent | transient | fatal
    duration_ms: int
    message_id: str | None = None
    error: BaseException | None = None


class DrainSummary(TypedDict):
    recovered: int
    failed: int
    skippedMaxRetries: int
    deferredBackoff: int
    expired: int
    unknown: int
    leftDue: int
    unconfigured: dict[str, Any]
    outages: dict[str, Any]
    rateLimited: int
    fatal: int
    fatalError: str | None


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
                 clock: Callable[[], float] = time.monotonic, concurrency: int = 1) -> None:
        self.store = store
        self.adapters = adapters
        self.lease = lease
        self.send_timeout_s = send_timeout_s
        self.expire = expire
        self.destinations = Destinations(store.db, store.schedule.delays_s, outage_threshold)
        self.chunks = ChunkLog(store.db)
        self.deduplicating = deduplicating()
        self.reporter = reporter
        self.limiter = limiter
        self.clock = clock
        self.concurrency = concurrency  # sends a drain run keeps in flight at once

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
        retrier = Retrier(policy, sleep=sleep or SLEEP,
                          remaining=deadline.remaining if deadline else None,
                          reserve_s=settings.delivery_send_timeout_s,
                          on_retry=limiter.on_retry)
        store = DeliveryStore(services.db, unknown_resends=settings.delivery_unknown_resends)
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
        """Send one claimed (``in_flight``) entry and settle it."""
        adapter = self.adapters.get(entry.channel)
        if adapter is None:
            return self._unconfigured(entry, timedelta(0))
        if self._throttled(entry, None):
            return SendOutcome.RATE_LIMITED
        sent = self._send(adapter, entry)
        if sent.verdict == "fatal":
            return self._fatal(entry, sent)
        if self._refused_for_rate(entry, sent):
            return SendOutcome.RATE_LIMITED
        if isinstance(sent.error, CredentialsRefused):  # configuration: no attempt counted
            self.store.release(entry, f"not sent: {describe(sent.error)}")
            return SendOutcome.UNCONFIGURED
        return self._settle(entry, sent)

    def _throttled(self, entry: DeliveryEntry, time_left_s: float | None) -> bool:
        return self.limiter is not None and self.limiter.hold(self.store, entry, time_left_s)

    def _refused_for_rate(self, entry: DeliveryEntry, sent: Sent) -> bool:
        return (self.limiter is not None and sent.verdict == "transient"
                and sent.error is not None
                and self.limiter.refused(self.store, entry, sent.error))

    def _send(self, adapter: ChannelAdapter, entry: DeliveryEntry,
              time_left: Callable[[], float] | None = None) -> Sent:
        started = self.clock()
        # a message in chunks resumes after those accepted, each further chunk with its slot
        progress = SendProgress(self.chunks, entry, self.limiter, time_left)
        try:
            if self.limiter is not None:
                with self.limiter.sending(entry):
                    message_id = adapter.send(entry, progress)
            else:
                message_id = adapter.send(entry, progress)
        except Exception as exc:  # noqa: BLE001 - the guard: any adapter error settles the entry
            # (a malformed recipient's ValueError is the entry's permanent failure: classify)
            return Sent(classify(exc), self._ms(started), error=exc)
        crash_point("delivery.after_send")
        return Sent("acked", self._ms(started), message_id)

    def _settle(self, entry: DeliveryEntry, sent: Sent) -> SendOutcome:
        if sent.verdict == "acked":
            if self.store.ack(entry, sent.message_id, sent.duration_ms):
                return SendOutcome.ACKED
            logger.warning(f"[delivery] {entry.id} was sent but its lease had lapsed; "
                           "another attempt may send it again")
            return SendOutcome.STALE
        assert sent.error is not None
        reason = describe(sent.error)
        if sent.verdict == "permanent":
            logger.warning(f"[delivery] {entry.channel} {entry.id} failed for good: {reason}")
            return SendOutcome.FAILED if self.store.fail(entry, reason,
                                                     duration_ms=sent.duration_ms) \
                else SendOutcome.STALE
        unknown = is_unknown(sent.error)
        status = self.store.nack(entry, reason, duration_ms=sent.duration_ms,
                                 retry_after_s=retry_after_s(sent.error), unknown=unknown,
                                 deduplicates=entry.channel in self.deduplicating)
        logger.warning(f"[delivery] {entry.channel} {entry.id} attempt {entry.attempts} "
                       f"failed: {reason}", extra={"next": status, "unknown": unknown})
        if status is None:
            return SendOutcome.STALE
        if unknown:
            return SendOutcome.UNKNOWN
        return SendOutcome.GAVE_UP if status is DeliveryStatus.FAILED else SendOutcome.RETRY

    def _unconfigured(self, entry: DeliveryEntry, hold: timedelta) -> SendOutcome:
        error = MissingAdapter(f"no adapter configured for channel {entry.channel!r}: "
                               "set its credential (see Configuration)")
        self.store.release(entry, describe(error), delay=hold)
        return SendOutcome.UNCONFIGURED

    def _fatal(self, entry: DeliveryEntry, sent: Sent) -> SendOutcome:
        assert sent.error is not None
        self.store.release(entry, f"not sent: the sender stopped: {describe(sent.error)}")
        if self.reporter is not None:
            self.reporter.error("delivery-drain", sent.error, entry=entry.id)
        return SendOutcome.FATAL

    def _ms(self, started: float) -> int:
        return int((self.clock() - started) * 1000)

    # --- the drain -----------------------------------------------------------------

    def drain(self, deadline: Deadline,
              progress: Callable[[str], None] = lambda message: None) -> DrainSummary:
        return _Run(self, deadline, progress).run()


class _Run:
    """One drain: the summary, and the destinations found failing (loaded, then kept current)."""

    def __init__(self, deliverer: Deliverer, deadline: Deadline,
                 progress: Callable[[str], None]) -> None:
        self.d = deliverer
        self.store = deliverer.store
        self.deadline = deadline
        self.progress = progress
        self.summary = DrainSummary(recovered=0, failed=0, skippedMaxRetries=0,
                                    deferredBackoff=0, expired=0, unknown=0, leftDue=0,
                                    unconfigured={"count": 0, "channels": {}},
                                    outages={"count": 0, "down": {}, "destinations": []},
                                    rateLimited=0, fatal=0, fatalError=None)
        self.failing: dict[str, FailingDestination] = {}
        self.up: set[str] = set()  # destinations that took an entry during this run
        self.stopped = threading.Event()
        # the summary and the destinations above, when several workers send at once
        self.lock = threading.RLock()

    def _hold(self) -> timedelta:
        """Set aside until after this run (so it is not claimed again before it ends)."""
        return timedelta(seconds=self.deadline.remaining() + 1)

    def run(self) -> DrainSummary:
        started: datetime = utcnow()
        summary = self.summary
        expired = self.store.expire(self.d.expire, now=started)
        summary["expired"] = expired
        summary["failed"] += expired
        if expired:
            logger.warning(f"[delivery] {expired} entries expired undelivered "
                           f"(older than {int(self.d.expire.total_seconds())} s)")
        back, unknown = self.store.recover(deduplicating=self.d.deduplicating)
        summary["unknown"] += unknown
        if back or unknown:
            logger.info(f"[delivery] {back} lapsed lease(s) back to pending, {unknown} "
                        "resting unknown (each may have been sent)")
        self.failing = self.d.destinations.load()
        if self.d.concurrency <= 1:
            self._work()
        else:
            self._in_parallel(self.d.concurrency)
        summary["deferredBackoff"] = self.store.count_backoff(since=started)
        summary["leftDue"] = self.store.count_due()
        destinations = self.d.destinations.status()
        summary["outages"]["destinations"] = destinations
        summary["outages"]["down"] = {
            d["key"]: f"{d['failures']} transient failures in a row since {d['downSince']}; "
                      f"{d['waiting']} entries waiting; last: {d['lastError']}"
            for d in destinations if d["down"]}
        return summary

    def _work(self) -> None:
        """Claim, send and settle one entry after another until none is due, the deadline
        nears (a whole send, its timeout, must still fit) or the run must stop."""
        summary = self.summary
        while not self.stopped.is_set() and self.deadline.remaining() > self.d.send_timeout_s:
            claimed = self.store.claim(self.d.lease)
            if not claimed:
                break
            crash_point("delivery.after_claim")
            try:
                if not self._one(claimed[0]):
                    self.stopped.set()
                    break
            except StoreError:
                raise  # the store's trouble is no entry's: the run stops, the lease lapses
            except Exception as exc:  # noqa: BLE001 - whatever one entry raises is its own failure
                logger.error(f"[delivery] {claimed[0].id} raised while being sent: {exc!r}")
                self._count(self.d._settle(claimed[0], Sent(classify(exc), 0, error=exc)))
            self.progress(f"delivery-drain: {summary['recovered']} delivered, "
                          f"{summary['failed'] + summary['skippedMaxRetries']} failed")

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

    def _one(self, entry: DeliveryEntry) -> bool:
        """Send and settle one entry; False when the run must stop."""
        summary = self.summary
        adapter = self.d.adapters.get(entry.channel)
        if adapter is None:
            self.d._unconfigured(entry, self._hold())
            with self.lock:
                unconfigured = summary["unconfigured"]
                unconfigured["count"] += 1
                unconfigured["channels"][entry.channel] = (
                    f"no adapter configured for channel {entry.channel!r}")
            return True
        try:
            key = adapter.outage_key(entry)
        except Exception as exc:  # noqa: BLE001 - a recipient that does not parse is this entry's
            self._count(self.d._settle(entry, Sent("permanent", 0, error=exc)))
            return True
        with self.lock:
            known = self.failing.get(key)
            holding = (known is not None and key not in self.up
                       and known.next_probe_at > utcnow())
        if holding:
            assert known is not None
            self._wait(entry, known)
            return True
        if self.d._throttled(entry, self.deadline.remaining() - self.d.send_timeout_s):
            self._add("rateLimited")
            return True
        sent = self.d._send(adapter, entry,
                            lambda: self.deadline.remaining() - self.d.send_timeout_s)
        if self.d._refused_for_rate(entry, sent):
            self._add("rateLimited")
            return True
        if sent.verdict == "fatal":
            self.d._fatal(entry, sent)
            with self.lock:
                summary["fatal"] = 1
                summary["fatalError"] = describe(sent.error) if sent.error else "fatal"
            return False
        if (sent.verdict == "transient" and sent.error is not None
                and not is_unknown(sent.error) and key not in self.up):
            # The destination failed, not (as far as anyone can tell) the entry: it waits.
            with self.lock:  # one worker at a time counts a destination's failures
                found = self.d.destinations.failed(key, describe(sent.error),
                                                   known=self.failing.get(key),
                                                   retry_after_s=retry_after_s(sent.error))
                self.failing[key] = found
            if self.d.destinations.reported(found):
                logger.warning(f"[delivery] {key} is down ({found.failures} failures in a row; "
                               f"last: {found.last_error}); its entries wait, no attempt "
                               "counted")
            self._wait(entry, found)
            return True
        if sent.verdict == "acked":
            with self.lock:
                self.up.add(key)
                back = self.failing.pop(key, None) is not None
            if back:
                self.d.destinations.up(key)
                logger.info(f"[delivery] {key} is back")
        self._count(self.d._settle(entry, sent))
        return True

    def _wait(self, entry: DeliveryEntry, destination: FailingDestination) -> None:
        delay = max(destination.next_probe_at - utcnow(), timedelta(0))
        self.store.release(entry, f"waiting: {destination.key} is failing since "
                                  f"{destination.down_since.isoformat()} "
                                  f"({destination.failures} in a row; last: "
                                  f"{destination.last_error})",
                           delay=delay, held_by=destination.key)
        with self.lock:
            self.summary["outages"]["count"] += 1

    def _count(self, outcome: SendOutcome) -> None:
        key = _COUNTED.get(outcome)
        if key is not None:
            self._add(key)

    def _add(self, key: str) -> None:
        with self.lock:
            self.summary[key] += 1  # type: ignore[literal-required]


# The summary key each outcome of a send adds one to.
_COUNTED = {SendOutcome.ACKED: "recovered", SendOutcome.FAILED: "failed",
            SendOutcome.GAVE_UP: "skippedMaxRetries", SendOutcome.UNKNOWN: "unknown"}


def report_drained(summary: DrainSummary, reporter: Reporter) -> None:
    """The ``queue_drained`` log record and metrics, after every drain."""
    logger.info("queue_drained", extra={"event": "queue_drained", "summary": dict(summary)})
    reporter.metrics({f"QueueDrained.{key}": float(value) for key, value in summary.items()
                      if isinstance(value, int)} | {
        "QueueDrained.unconfigured": float(summary["unconfigured"]["count"]),
        "QueueDrained.outages": float(summary["outages"]["count"]),
        "QueueDrained.destinationsDown": float(len(summary["outages"]["down"]))},
        event="queue_drained")


def run_delivery_drain(ctx: JobContext) -> dict[str, Any]:
    settings = ctx.services.settings
    with Outbound.open(settings, deadline_s=ctx.deadline.remaining()) as client:
        deliverer = Deliverer.from_services(ctx.services, client, deadline=ctx.deadline)
        summary = deliverer.drain(ctx.deadline, ctx.progress)
    report_drained(summary, ctx.services.reporter)
    pruned = deliverer.store.prune(utcnow() - timedelta(days=settings.delivery_retention_days))
    if pruned:
        logger.info(f"[delivery] pruned {pruned} settled entries older than "
                    f"{settings.delivery_retention_days} days")
    return dict(summary)


__all__ = ["Deliverer", "DrainSummary", "SendOutcome", "check_enqueue", "report_drained",
           "run_delivery_drain"]
