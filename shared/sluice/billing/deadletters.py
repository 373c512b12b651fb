"""The AI-ledger DLQ (``ai:ledger:retry:dlq`` in Redis) as a dead-letter source.

A redrive puts an entry back on the retry queue with its attempts reset; a purge
removes entries one by one (``LREM`` of the exact value), so an entry dead-lettered
meanwhile is never deleted unseen.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sluice.core.deadletters import (
    DeadLetter,
    RedriveReport,
    choose,
    newest_first,
    redrive_each,
)
from sluice.core.errors import Conflict
from sluice.store.redis_clients import LEDGER_RETRY_DLQ, LEDGER_RETRY_QUEUE

if TYPE_CHECKING:
    from sluice.core.services import Services

LEDGER = "ledger"
MAX_SCAN = 500


class RedisNotConfigured(Conflict):
    """No Redis is configured, so there is no ledger DLQ to read."""

    code = "redis_not_configured"


def ledger_letter(raw: str) -> DeadLetter:
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"raw": raw}
    entry_id = body.get("id") if isinstance(body.get("id"), str) else None
    if not entry_id:
        entry_id = "raw-" + hashlib.sha256(raw.encode()).hexdigest()[:16]
    reason = body.get("reason") or body.get("lastError") or ""
    return DeadLetter(entry_id, LEDGER, str(reason), body.get("deadLetteredAt"), body, raw)


def _vet(letter: DeadLetter) -> str | None:
    if "entry" not in letter.body or not isinstance(letter.body.get("id"), str):
        return "not a ledger retry envelope; it cannot be redriven"
    return None


class LedgerDeadLetters:
    name = LEDGER

    def __init__(self, services: Services) -> None:
        self.services = services

    def _redis(self) -> Any:
        redis = self.services.redis
        if redis is None:
            raise RedisNotConfigured()
        return redis

    def show(self, entry_id: str) -> DeadLetter | None:
        found = choose(self.list(MAX_SCAN), [entry_id], 1)
        return found[0] if found else None

    def _send(self, letter: DeadLetter) -> dict[str, Any]:
        body = letter.body
        envelope = {"id": body["id"], "attempts": 0, "enqueuedAt": body.get("enqueuedAt"),
                    "lastError": body.get("reason") or body.get("lastError"),
                    "entry": body["entry"]}
        redis = self._redis()
        redis.lpush(LEDGER_RETRY_QUEUE, json.dumps(envelope, separators=(",", ":")))
        redis.lrem(LEDGER_RETRY_DLQ, 1, letter.raw)
        return {"id": letter.id}

    def redrive(self, ids: list[str] | None, limit: int, *, dry_run: bool,
                pace: Callable[[], None]) -> RedriveReport:
        chosen = choose(self.list(MAX_SCAN if ids else limit), ids, limit)

        def on_error(letter: DeadLetter, exc: Exception) -> None:
            self.services.reporter.error("dlq.redrive", exc, queue=LEDGER, id=letter.id)

        return redrive_each(chosen, ids, dry_run=dry_run, pace=pace, vet=_vet, send=self._send,
                            on_error=on_error)

    def purge(self, ids: list[str] | None) -> int:
        redis = self._redis()
        raws = (redis.lrange(LEDGER_RETRY_DLQ, 0, -1) if ids is None
                else [d.raw for d in choose(self.list(MAX_SCAN), ids, MAX_SCAN)])
        return sum(int(redis.lrem(LEDGER_RETRY_DLQ, 1, raw)) for raw in raws)

    def depth(self) -> int:
        return int(self._redis().llen(LEDGER_RETRY_DLQ))

    def list(self, limit: int) -> list[DeadLetter]:
        # LPUSH puts the newest first already; the sort keeps that order for equal timestamps.
        return newest_first(ledger_letter(raw)
                            for raw in self._redis().lrange(LEDGER_RETRY_DLQ, 0, limit - 1))
