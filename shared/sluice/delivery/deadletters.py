"""Failed deliveries (status ``failed``) as a dead-letter source.

A redrive puts an entry back to ``pending`` with its attempts reset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sluice.core.deadletters import (
    DeadLetter,
    RedriveReport,
    choose,
    newest_first,
    redrive_each,
)
from sluice.delivery.store import DeliveryEntry, DeliveryStatus, DeliveryStore

if TYPE_CHECKING:
    from sluice.core.services import Services

DELIVERY = "delivery"
MAX_SCAN = 500


def delivery_letter(entry: DeliveryEntry) -> DeadLetter:
    body = entry.to_json()
    return DeadLetter(entry.id, DELIVERY, entry.last_error or "", body.get("failedAt"), body)


class DeliveryDeadLetters:
    name = DELIVERY

    def __init__(self, services: Services) -> None:
        self.services = services
        self.store = DeliveryStore(services.db)

    def show(self, entry_id: str) -> DeadLetter | None:
        found = choose(self.list(MAX_SCAN), [entry_id], 1)
        return found[0] if found else None

    def _send(self, letter: DeadLetter) -> dict[str, Any]:
        return {"id": letter.id, "status": self.store.redrive(letter.id).status.value}

    def redrive(self, ids: list[str] | None, limit: int, *, dry_run: bool,
                pace: Callable[[], None]) -> RedriveReport:
        chosen = choose(self.list(MAX_SCAN if ids else limit), ids, limit)

        def on_error(letter: DeadLetter, exc: Exception) -> None:
            self.services.reporter.error("dlq.redrive", exc, queue=DELIVERY, id=letter.id)

        return redrive_each(chosen, ids, dry_run=dry_run, pace=pace, vet=lambda d: None,
                            send=self._send, on_error=on_error)

    def purge(self, ids: list[str] | None) -> int:
        if ids is None:
            return self.store.purge_all()
        chosen = choose(self.list(MAX_SCAN), ids, MAX_SCAN)
        for letter in chosen:
            self.store.purge(letter.id)
        return len(chosen)

    def depth(self) -> int:
        return int(self.store.stats()["failed"]["count"])

    def list(self, limit: int) -> list[DeadLetter]:
        return newest_first(delivery_letter(e)
                            for e in self.store.list(status=DeliveryStatus.FAILED, limit=limit))
