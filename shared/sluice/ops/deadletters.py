"""Dead letters that are read: list, show, redrive and purge, from every source.

The sources (one per store, behind ``DeadLetterSource``): each topic's ``<topic>-dlq``
and the quarantine of rejected messages (``sluice.queues.deadletters``), the Redis
AI-ledger DLQ (``sluice.billing.deadletters``) and the failed deliveries
(``sluice.delivery.deadletters``). Here: the table of them, the caps, the pacing of a
redrive, a dry run, and an audit row for every redrive and purge.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sluice.billing.deadletters import LEDGER, LedgerDeadLetters
from sluice.core.deadletters import DeadLetterSource
from sluice.core.errors import NotFound, RequestError, SluiceError
from sluice.core.extensions import packs_on
from sluice.delivery.deadletters import DELIVERY, DeliveryDeadLetters
from sluice.jobs.runs import RunStore
from sluice.queues.deadletters import QUARANTINE, queue_sources
from sluice.queues.publish import Publisher
from sluice.queues.runtime import publisher_of
from sluice.queues.sqs import Sqs
from sluice.queues.topics import TOPICS
from sluice.store.db import utcnow

if TYPE_CHECKING:
    from sluice.core.services import Services


def names() -> tuple[str, ...]:
    """Every dead-letter source: each topic's DLQ (the app's too), the quarantine, then
    those of the packs that are on (the ledger's DLQ, the failed deliveries)."""
    on = packs_on()
    return (*TOPICS, QUARANTINE,
            *(name for name, pack in ((LEDGER, "ledger"), (DELIVERY, "delivery")) if pack in on))

MAX_LIST = 500
MAX_REDRIVE = 100  # per call
DEFAULT_REDRIVE = 10
REDRIVE_PER_SECOND = 10.0


class DeadLetters:
    def __init__(self, services: Services, *, publisher: Publisher | None = None,
                 sqs: Sqs | None = None, sleep: Callable[[float], None] = time.sleep,
                 per_second: float = REDRIVE_PER_SECOND,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.services = services
        self._publisher = publisher
        self._sqs = sqs
        self.sleep = sleep
        self.per_second = per_second
        self.clock = clock
        packs: dict[str, DeadLetterSource] = {LEDGER: LedgerDeadLetters(services),
                                              DELIVERY: DeliveryDeadLetters(services)}
        self.sources: dict[str, DeadLetterSource] = {
            **queue_sources(services, self._get_publisher, self._get_sqs),
            **{name: packs[name] for name in names() if name in packs},
        }

    def _get_publisher(self) -> Publisher:
        if self._publisher is None:
            self._publisher = publisher_of(self.services)
        return self._publisher

    def _get_sqs(self) -> Sqs:
        if self._sqs is None:
            self._sqs = self._get_publisher().sqs
        return self._sqs

    def source(self, name: str) -> DeadLetterSource:
        try:
            return self.sources[name]
        except KeyError:
            raise NotFound(f"no DLQ named {name!r}; known: {', '.join(names())}") from None

    def list_letters(self, name: str, limit: int = 50) -> dict[str, Any]:
        source = self.source(name)
        letters = source.list(max(1, min(limit, MAX_LIST)))
        now = self.clock()
        return {"queue": name, "depth": source.depth(),
                "items": [d.to_dict(now) for d in letters]}

    def depth(self, name: str) -> int:
        return self.source(name).depth()

    def overview(self) -> list[dict[str, Any]]:
        rows = []
        for name, source in self.sources.items():
            try:
                rows.append({"queue": name, "depth": source.depth()})
            except SluiceError as exc:
                rows.append({"queue": name, "depth": None, "error": exc.code})
        return rows

    def show(self, name: str, entry_id: str) -> dict[str, Any]:
        letter = self.source(name).show(entry_id)
        if letter is None:
            raise NotFound(f"no dead letter {entry_id!r} in {name}")
        return letter.to_dict(self.clock(), full=True)

    def _audit(self, action: str, name: str, actor: str, outcome: str,
               detail: dict[str, Any]) -> None:
        RunStore(self.services.db).audit(actor=actor, action=action, target=f"dlq:{name}",
                                         outcome=outcome, ip=None, detail=detail)

    def _pace(self) -> None:
        if self.per_second > 0:
            self.sleep(1.0 / self.per_second)

    def redrive(self, name: str, *, ids: list[str] | None = None, limit: int = DEFAULT_REDRIVE,
                dry_run: bool = False, actor: str = "unknown") -> dict[str, Any]:
        source = self.source(name)
        if not 1 <= limit <= MAX_REDRIVE:
            raise RequestError(f"limit must be between 1 and {MAX_REDRIVE}")
        if ids is not None and len(ids) > MAX_REDRIVE:
            raise RequestError(f"at most {MAX_REDRIVE} ids per redrive")
        report = source.redrive(ids, limit, dry_run=dry_run, pace=self._pace)
        result: dict[str, Any] = {"queue": name, "dryRun": dry_run, "redriven": report.redriven,
                                  "refused": report.refused, "failed": report.failed,
                                  "notFound": report.not_found, "count": len(report.redriven)}
        if dry_run:
            return result  # a preview changed nothing: nothing to audit
        outcome = "failures" if report.failed or report.refused else "ok"
        self._audit("dlq:redrive", name, actor, outcome,
                    {"ids": [r["id"] for r in (*report.redriven, *report.refused,
                                               *report.failed)],
                     "dryRun": dry_run, "count": result["count"], "failed": report.failed,
                     "refused": report.refused})
        return result

    def purge(self, name: str, *, ids: list[str] | None = None,
              actor: str = "unknown") -> dict[str, Any]:
        """Delete the given dead letters, or every one when ``ids`` is None."""
        purged = self.source(name).purge(ids)
        self._audit("dlq:purge", name, actor, "ok", {"ids": ids, "purged": purged})
        return {"queue": name, "purged": purged}
