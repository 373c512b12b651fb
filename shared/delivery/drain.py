"""Sending from the delivery queue: the inline path and the ``delivery-drain`` job.

Inline, ``Deliverer.deliver`` stores the entry (``in_flight``, attempt 1, under a
lease) before it calls the adapter, then settles it. If the process dies between
the two, the lease lapses and the next drain sends it: at-least-once, and a
webhook receiver can drop the duplicate by its ``Idempotency-Key``.

The drain returns lapsed leases to ``pending``, then claims due entries one at a
time and sends each, until none is due or the deadline is near; finally it
prunes settled entries past their retention. Its result, following the seed's
``RecoverySummary``:

- ``recovered``: entries delivered (acked) by this run;
- ``failed``: entries failed by this run for a permanent error or a missing adapter;
- ``skippedMaxRetries``: entries failed by this run because their last attempt
  (the fifth) failed transiently, or its sender died holding the lease;
- ``deferredBackoff``: entries left ``pending`` for a later run when it ended:
  waiting out their backoff (those it just retried among them) or not reached
  before the deadline. Waiting is not failing: only the first two are failures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from enum import StrEnum
from typing import Any, TypedDict

import httpx

from shared.core.crash import crash_point
from shared.core.observe import logger
from shared.core.services import Services
from shared.delivery.channels import ChannelAdapter, build_adapters
from shared.delivery.classify import MissingAdapter, classify, describe, retry_after_s
from shared.delivery.store import DeliveryEntry, DeliveryStatus, DeliveryStore
from shared.jobs.registry import Deadline, JobContext
from shared.store.db import utcnow


class AttemptOutcome(StrEnum):
    """How one send attempt of a delivery entry ended."""

    ACKED = "acked"
    RETRY = "retry"  # back to pending, on the schedule
    FAILED = "failed"  # permanent error or no adapter
    GAVE_UP = "gave_up"  # the last attempt failed
    STALE = "stale"  # the entry was no longer ours to settle (our lease lapsed meanwhile)


class DrainSummary(TypedDict):
    recovered: int
    failed: int
    skippedMaxRetries: int
    deferredBackoff: int


class Deliverer:
    def __init__(self, store: DeliveryStore, adapters: Mapping[str, ChannelAdapter], *,
                 lease: timedelta, send_timeout_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.adapters = adapters
        self.lease = lease
        self.send_timeout_s = send_timeout_s
        self.clock = clock

    @classmethod
    def from_services(cls, services: Services, client: httpx.Client) -> Deliverer:
        settings = services.settings
        return cls(DeliveryStore(services.db), build_adapters(settings, client),
                   lease=timedelta(seconds=settings.delivery_lease_s),
                   send_timeout_s=settings.delivery_send_timeout_s)

    def deliver(self, channel: str, recipient: str, payload: dict[str, Any], *,
                idempotency_key: str | None = None,
                subject_user_id: str | None = None) -> tuple[DeliveryEntry, AttemptOutcome | None]:
        """Enqueue, send, settle. With a key already stored, nothing is sent again:
        ``(that entry, None)``."""
        entry, created = self.store.enqueue(channel, recipient, payload,
                                            idempotency_key=idempotency_key,
                                            subject_user_id=subject_user_id, lease=self.lease)
        if not created:
            return entry, None
        crash_point("delivery.after_enqueue")
        outcome = self.attempt(entry)
        return self.store.get(entry.id), outcome

    def attempt(self, entry: DeliveryEntry) -> AttemptOutcome:
        """Send one claimed (``in_flight``) entry and settle it."""
        adapter = self.adapters.get(entry.channel)
        if adapter is None:
            error = MissingAdapter(f"no adapter configured for channel {entry.channel!r}")
            return self._failed(entry, error, None)
        started = self.clock()
        try:
            message_id = adapter.send(entry)
        except Exception as exc:  # noqa: BLE001 - the guard: any adapter error settles the entry
            duration = self._ms(started)
            if classify(exc) == "permanent":
                return self._failed(entry, exc, duration)
            status = self.store.nack(entry, describe(exc), duration_ms=duration,
                                     retry_after_s=retry_after_s(exc))
            logger.warning(f"[delivery] {entry.channel} {entry.id} attempt {entry.attempts} "
                           f"failed: {describe(exc)}", extra={"next": status})
            if status is None:
                return AttemptOutcome.STALE
            return AttemptOutcome.RETRY if status is DeliveryStatus.PENDING else AttemptOutcome.GAVE_UP
        crash_point("delivery.after_send")
        if self.store.ack(entry, message_id, self._ms(started)):
            return AttemptOutcome.ACKED
        logger.warning(f"[delivery] {entry.id} was sent but its lease had lapsed; "
                       "another attempt may send it again")
        return AttemptOutcome.STALE

    def _failed(self, entry: DeliveryEntry, error: BaseException, duration: int | None) -> AttemptOutcome:
        reason = describe(error)
        logger.warning(f"[delivery] {entry.channel} {entry.id} failed for good: {reason}")
        return AttemptOutcome.FAILED if self.store.fail(entry, reason, duration_ms=duration) \
            else AttemptOutcome.STALE

    def _ms(self, started: float) -> int:
        return int((self.clock() - started) * 1000)

    def drain(self, deadline: Deadline,
              progress: Callable[[str], None] = lambda message: None) -> DrainSummary:
        summary = DrainSummary(recovered=0, failed=0, skippedMaxRetries=0, deferredBackoff=0)
        back, lost = self.store.recover()
        summary["skippedMaxRetries"] += lost
        if back or lost:
            logger.info(f"[delivery] {back} lapsed lease(s) back to pending, {lost} failed")
        # Stop while a whole send (its timeout) still fits before the deadline.
        while deadline.remaining() > self.send_timeout_s:
            claimed = self.store.claim(self.lease)
            if not claimed:
                break
            crash_point("delivery.after_claim")
            outcome = self.attempt(claimed[0])
            if outcome is AttemptOutcome.ACKED:
                summary["recovered"] += 1
            elif outcome is AttemptOutcome.FAILED:
                summary["failed"] += 1
            elif outcome is AttemptOutcome.GAVE_UP:
                summary["skippedMaxRetries"] += 1
            progress(f"delivery-drain: {summary['recovered']} delivered, "
                     f"{summary['failed'] + summary['skippedMaxRetries']} failed")
        summary["deferredBackoff"] = self.store.count_pending()
        return summary


def run_delivery_drain(ctx: JobContext) -> dict[str, Any]:
    settings = ctx.services.settings
    with httpx.Client(timeout=settings.delivery_send_timeout_s) as client:
        deliverer = Deliverer.from_services(ctx.services, client)
        summary = deliverer.drain(ctx.deadline, ctx.progress)
    pruned = deliverer.store.prune(utcnow() - timedelta(days=settings.delivery_retention_days))
    if pruned:
        logger.info(f"[delivery] pruned {pruned} settled entries older than "
                    f"{settings.delivery_retention_days} days")
    return dict(summary)
