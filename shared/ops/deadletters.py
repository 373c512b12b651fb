"""Dead letters that are read: list, show, redrive and purge.

Three kinds of DLQ: each topic's ``<topic>-dlq`` (SQS when provisioned, the
``queue_dead_letters`` table in process), the Redis AI-ledger DLQ
(``ai:ledger:retry:dlq``) and the delivery queue's ``failed`` entries
(``delivery``). Redrive puts a topic message back on its topic, re-signed with the
current secret (its idempotency key is unchanged, so a message that meanwhile
completed is not run twice), a ledger entry back on the retry queue with its
attempts reset, and a failed delivery back to ``pending`` with its attempts reset. Redrive is capped per call and paced,
supports a dry run, and every redrive and purge is audited.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from shared.core.errors import Conflict, NotFound, RequestError, SluiceError
from shared.core.times import from_epoch_ms
from shared.jobs.runs import RunStore
from shared.queues.publish import (
    TOPICS,
    LocalDeadLetters,
    Publisher,
    Sqs,
    check_topic,
)
from shared.queues.signing import SIGNATURE_FIELD
from shared.queues.topics import publisher_of
from shared.store.db import utcnow
from shared.store.redis_clients import LEDGER_RETRY_DLQ, LEDGER_RETRY_QUEUE

if TYPE_CHECKING:
    from shared.core.services import Services

LEDGER = "ledger"
DELIVERY = "delivery"
NAMES: tuple[str, ...] = (*TOPICS, LEDGER, DELIVERY)
MAX_LIST = 500
MAX_REDRIVE = 100  # per call
DEFAULT_REDRIVE = 10
REDRIVE_PER_SECOND = 10.0
PEEK_HIDE_S = 30  # how long a peeked SQS dead letter stays hidden if the release fails


class RedisNotConfigured(Conflict):
    """No Redis is configured, so there is no ledger DLQ to read."""

    code = "redis_not_configured"


@dataclass
class DeadLetter:
    id: str
    queue: str
    reason: str
    failed_at: str | None
    body: dict[str, Any]
    raw: str = ""
    handle: str | None = field(default=None, repr=False)  # SQS receipt handle

    def age_s(self, now: datetime) -> float | None:
        if not self.failed_at:
            return None
        try:
            at = datetime.fromisoformat(self.failed_at)
        except ValueError:
            return None
        return round((now - at.astimezone(UTC)).total_seconds(), 3)

    def to_dict(self, now: datetime, *, full: bool = False) -> dict[str, Any]:
        item: dict[str, Any] = {"id": self.id, "queue": self.queue, "reason": self.reason,
                                "failedAt": self.failed_at, "ageSeconds": self.age_s(now)}
        if full:
            item["body"] = self.body
        return item


def check_name(name: str) -> str:
    if name not in NAMES:
        raise NotFound(f"no DLQ named {name!r}; known: {', '.join(NAMES)}")
    return name


def _js_ms(ms: str | None) -> str | None:
    if not ms or not ms.isdigit():
        return None
    return from_epoch_ms(int(ms))


def topic_letter(topic: str, entry_id: str, raw: str, sent_ms: str | None = None,
                 ) -> DeadLetter:
    """A topic DLQ body: the consumer's summary, or (the redrive-policy backstop) the message."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return DeadLetter(entry_id, topic, "unreadable dead letter", _js_ms(sent_ms),
                          {"raw": raw}, raw)
    if isinstance(body.get("originalMessage"), dict):
        return DeadLetter(entry_id, topic, str(body.get("errorMessage") or ""),
                          body.get("failedAt") or _js_ms(sent_ms), body, raw)
    return DeadLetter(entry_id, topic, "exceeded the queue's maxReceiveCount (redrive policy)",
                      _js_ms(sent_ms), {"originalMessage": body}, raw)


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


def delivery_letter(entry: Any) -> DeadLetter:
    body = entry.to_json()
    return DeadLetter(entry.id, DELIVERY, entry.last_error or "", body.get("failedAt"), body)


class DeadLetters:
    def __init__(self, services: Services, *, publisher: Publisher | None = None,
                 sqs: Sqs | None = None, sleep: Callable[[float], None] = time.sleep,
                 per_second: float = REDRIVE_PER_SECOND,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.services = services
        self.publisher = publisher or publisher_of(services)
        self._sqs = sqs
        self.sleep = sleep
        self.per_second = per_second
        self.clock = clock
        self.local = LocalDeadLetters(services.db)

    @property
    def sqs(self) -> Sqs:
        if self._sqs is None:
            self._sqs = self.publisher.sqs
        return self._sqs

    @property
    def _on_sqs(self) -> bool:
        return self.services.settings.queue_mode == "sqs"

    def _redis(self) -> Any:
        redis = self.services.redis
        if redis is None:
            raise RedisNotConfigured()
        return redis

    # --- reading ---------------------------------------------------------------

    def _peek_sqs(self, topic: str, limit: int) -> list[DeadLetter]:
        """Receive up to ``limit`` dead letters, hidden briefly; the caller releases them."""
        url = self.sqs.dlq_url(topic)
        found: dict[str, DeadLetter] = {}
        for _ in range(limit // 10 + 3):
            batch = self.sqs.receive(url, max_messages=min(10, limit - len(found)) or 1,
                                     visibility=PEEK_HIDE_S)
            if not batch:
                break
            for message in batch:
                letter = topic_letter(topic, message["MessageId"], message["Body"],
                                      message.get("Attributes", {}).get("SentTimestamp"))
                letter.handle = message["ReceiptHandle"]
                found[letter.id] = letter
            if len(found) >= limit:
                break
        return list(found.values())

    def _release(self, topic: str, letters: Iterable[DeadLetter]) -> None:
        url = self.sqs.dlq_url(topic)
        for letter in letters:
            if letter.handle:
                self.sqs.change_visibility(url, letter.handle, 0)

    def _deliveries(self) -> Any:
        from shared.delivery.store import DeliveryStore

        return DeliveryStore(self.services.db)

    def _read(self, name: str, limit: int) -> list[DeadLetter]:
        """Newest first. SQS letters come back still hidden, with their receipt handles."""
        if name == DELIVERY:
            from shared.delivery.store import DeliveryStatus

            entries = self._deliveries().list(status=DeliveryStatus.FAILED, limit=limit)
            return sorted((delivery_letter(e) for e in entries),
                          key=lambda d: d.failed_at or "", reverse=True)
        if name == LEDGER:
            letters = [ledger_letter(raw) for raw in self._redis().lrange(LEDGER_RETRY_DLQ, 0,
                                                                        limit - 1)]
            # LPUSH puts the newest first already; keep that order for equal timestamps.
            return sorted(letters, key=lambda d: d.failed_at or "", reverse=True)
        if self._on_sqs:
            letters = self._peek_sqs(name, limit)
        else:
            letters = [topic_letter(name, row["id"], json.dumps(row["summary"]))
                       for row in self.local.list(name, limit)]
        return sorted(letters, key=lambda d: d.failed_at or "", reverse=True)

    def list_letters(self, name: str, limit: int = 50) -> dict[str, Any]:
        check_name(name)
        limit = max(1, min(limit, MAX_LIST))
        letters = self._read(name, limit)
        if self._on_sqs and name in TOPICS:
            self._release(name, letters)
        now = self.clock()
        return {"queue": name, "depth": self.depth(name),
                "items": [d.to_dict(now) for d in letters]}

    def depth(self, name: str) -> int:
        if name == DELIVERY:
            return int(self._deliveries().stats()["failed"]["count"])
        if name == LEDGER:
            return int(self._redis().llen(LEDGER_RETRY_DLQ))
        if self._on_sqs:
            counts = self.sqs.depth(self.sqs.dlq_url(name))
            return counts["visible"] + counts["inFlight"] + counts["delayed"]
        return self.local.count(name)

    def overview(self) -> list[dict[str, Any]]:
        rows = []
        for name in NAMES:
            try:
                rows.append({"queue": name, "depth": self.depth(name)})
            except SluiceError as exc:
                rows.append({"queue": name, "depth": None, "error": exc.code})
        return rows

    def _find(self, name: str, ids: list[str] | None, limit: int) -> list[DeadLetter]:
        letters = self._read(name, MAX_LIST if ids else limit)
        if ids is None:
            chosen = letters[:limit]
        else:
            wanted = set(ids)
            chosen = [d for d in letters if d.id in wanted or d.body.get("originalMessageId")
                      in wanted]
        if self._on_sqs and name in TOPICS:
            self._release(name, [d for d in letters if d not in chosen])
        return chosen

    def show(self, name: str, entry_id: str) -> dict[str, Any]:
        check_name(name)
        found = self._find(name, [entry_id], MAX_LIST)
        if self._on_sqs and name in TOPICS:
            self._release(name, found)
        if not found:
            raise NotFound(f"no dead letter {entry_id!r} in {name}")
        return found[0].to_dict(self.clock(), full=True)

    # --- writing ---------------------------------------------------------------

    def _audit(self, action: str, name: str, actor: str, outcome: str,
               detail: dict[str, Any]) -> None:
        RunStore(self.services.db).audit(actor=actor, action=action, target=f"dlq:{name}",
                                         outcome=outcome, ip=None, detail=detail)

    def _redrive_one(self, letter: DeadLetter) -> dict[str, Any]:
        if letter.queue == DELIVERY:
            entry = self._deliveries().redrive(letter.id)
            return {"id": letter.id, "status": entry.status.value}
        if letter.queue == LEDGER:
            body = letter.body
            if "entry" not in body or not isinstance(body.get("id"), str):
                raise RequestError("not a ledger retry envelope; it cannot be redriven")
            envelope = {"id": body["id"], "attempts": 0, "enqueuedAt": body.get("enqueuedAt"),
                        "lastError": body.get("reason") or body.get("lastError"),
                        "entry": body["entry"]}
            redis = self._redis()
            redis.lpush(LEDGER_RETRY_QUEUE, json.dumps(envelope, separators=(",", ":")))
            redis.lrem(LEDGER_RETRY_DLQ, 1, letter.raw)
            return {"id": letter.id}
        original = letter.body.get("originalMessage")
        if not isinstance(original, dict):
            raise RequestError("no original message to redrive")
        check_topic(str(original.get("topic")), publishing=True)
        signed = self.publisher.signer.sign(
            {k: v for k, v in original.items() if k != SIGNATURE_FIELD})
        published = self.publisher.send_signed(signed)
        # Only after the re-publish succeeded is the dead letter removed.
        if letter.handle:
            self.sqs.delete(self.sqs.dlq_url(letter.queue), letter.handle)
        else:
            self.local.delete(letter.queue, letter.id)
        return {"id": letter.id, "messageId": published.message_id,
                "idempotencyKey": published.idempotency_key}

    def redrive(self, name: str, *, ids: list[str] | None = None, limit: int = DEFAULT_REDRIVE,
                dry_run: bool = False, actor: str = "unknown") -> dict[str, Any]:
        check_name(name)
        if not 1 <= limit <= MAX_REDRIVE:
            raise RequestError(f"limit must be between 1 and {MAX_REDRIVE}")
        if ids is not None and len(ids) > MAX_REDRIVE:
            raise RequestError(f"at most {MAX_REDRIVE} ids per redrive")
        chosen = self._find(name, ids, limit)
        result: dict[str, Any] = {"queue": name, "dryRun": dry_run, "redriven": [],
                                  "failed": [], "notFound": []}
        if ids is not None:
            seen = {d.id for d in chosen} | {str(d.body.get("originalMessageId")) for d in chosen}
            result["notFound"] = [i for i in ids if i not in seen]
        try:
            for n, letter in enumerate(chosen):
                if dry_run:
                    result["redriven"].append({"id": letter.id, "reason": letter.reason})
                    continue
                if n and self.per_second > 0:
                    self.sleep(1.0 / self.per_second)
                try:
                    result["redriven"].append(self._redrive_one(letter))
                except Exception as exc:  # noqa: BLE001 - one bad letter must not stop the rest
                    result["failed"].append({"id": letter.id, "error": str(exc)[:500]})
                    self.services.reporter.error("dlq.redrive", exc, queue=name, id=letter.id)
        finally:
            if self._on_sqs and name in TOPICS:
                # Whatever was not redriven (dry run, failures) becomes visible again.
                done = {r["id"] for r in result["redriven"]} if not dry_run else set()
                self._release(name, [d for d in chosen if d.id not in done])
        result["count"] = len(result["redriven"])
        self._audit("dlq:redrive", name, actor, "dry_run" if dry_run else (
            "failures" if result["failed"] else "ok"),
            {"ids": [d.id for d in chosen], "dryRun": dry_run, "count": result["count"],
             "failed": result["failed"]})
        return result

    def purge(self, name: str, *, ids: list[str] | None = None,
              actor: str = "unknown") -> dict[str, Any]:
        """Delete the given dead letters, or every one when ``ids`` is None."""
        check_name(name)
        purged = 0
        if name == DELIVERY:
            store = self._deliveries()
            chosen = self._find(name, ids, MAX_LIST) if ids is not None else None
            if chosen is None:
                purged = store.purge_all()
            else:
                for letter in chosen:
                    store.purge(letter.id)
                    purged += 1
        elif name == LEDGER:
            redis = self._redis()
            # Item by item (LREM of the exact value), so an entry dead-lettered
            # meanwhile is not deleted unseen.
            raws = (redis.lrange(LEDGER_RETRY_DLQ, 0, -1) if ids is None
                    else [letter.raw for letter in self._find(name, ids, MAX_LIST)])
            for raw in raws:
                purged += int(redis.lrem(LEDGER_RETRY_DLQ, 1, raw))
        elif self._on_sqs:
            url = self.sqs.dlq_url(name)
            while True:
                letters = self._find(name, ids, MAX_LIST)
                for letter in letters:
                    if letter.handle:
                        self.sqs.delete(url, letter.handle)
                        purged += 1
                if ids is not None or not letters:
                    break
        elif ids is None:
            purged = self.local.purge(name)
        else:
            purged = sum(self.local.delete(name, i) for i in ids)
        self._audit("dlq:purge", name, actor, "ok", {"ids": ids, "purged": purged})
        return {"queue": name, "purged": purged}
