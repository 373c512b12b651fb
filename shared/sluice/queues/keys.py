"""Completed messages: which signed contents already ran, remembered for the queue's retention.

A message is identified by its topic and the SHA-256 of its full canonical signing
input (:func:`dedupe_key`), so only signed content decides what is a duplicate. The
``idempotencyKey`` message attribute (:func:`idempotency_key`, made as the message's topic
declares) is still sent for interoperability with other producers and consumers, but is
never trusted: it is not signed, and two different messages can share it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from sluice.queues.signing import SIGNATURE_FIELD, canonical, js_stringify
from sluice.queues.topics import get_topic
from sluice.store.db import Database, load_queries, utcnow

if TYPE_CHECKING:
    from sluice.core.services import Services

Q = load_queries("queues")

# How long a completed key is remembered: SQS's default retention (4 days); a
# redrive from a DLQ completes the key again with a fresh expiry.
KEY_RETENTION = timedelta(days=4)
EXPIRED_KEYS_PER_WRITE = 100
IDEMPOTENCY_ATTRIBUTE = "idempotencyKey"
_NON_ALNUM = re.compile(r"[^A-Za-z0-9]")


def dedupe_key(topic: str, message: Mapping[str, Any] | bytes) -> str:
    """``<topic>:<hex SHA-256 of the canonical signing input>``.

    The signature is not part of the input, so a message re-signed after a secret
    rotation (a redrive) keeps its key.
    """
    payload = message if isinstance(message, bytes) else canonical(message)
    return f"{topic}:{hashlib.sha256(payload).hexdigest()}"


def idempotency_key(message: Mapping[str, Any]) -> str:
    """The ``idempotencyKey`` attribute of a message, made as its topic declares
    (``Topic.key``): a function of the message (``rss.ingest``: :func:`reference_key`), the
    values of named fields (``<topic>:<v1>:<v2>``, each a string as it is, any other value as
    compact JSON), or by default the message's content hash (:func:`dedupe_key`).
    Informational only; deduplication uses :func:`dedupe_key`."""
    topic = get_topic(str(message.get("topic")))
    if callable(topic.key):
        return topic.key(message)
    if topic.key:
        return ":".join([topic.name, *(_part(message.get(name)) for name in topic.key)])
    return dedupe_key(topic.name, message)


def _part(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"),
                                                          ensure_ascii=False)


def reference_key(message: Mapping[str, Any]) -> str:
    """``<topic>:<batchId>:<first 96 chars of the JSON, non-alphanumerics as _>``: the
    ``rss.ingest`` key, as the JavaScript producer makes it. The JSON is the message
    without its signature as ``JSON.stringify`` writes it."""
    body = {k: v for k, v in message.items() if k != SIGNATURE_FIELD}
    return f"{message.get('topic', '')}:{message.get('batchId', '')}:{js_prefix(js_stringify(body))}"


def js_prefix(text: str, length: int = 96) -> str:
    """``text.slice(0, length).replace(/[^a-zA-Z0-9]/g, '_')``: JavaScript counts UTF-16 code
    units, so a character outside the BMP is two units, and two ``_``."""
    if text.isascii():
        return _NON_ALNUM.sub("_", text[:length])
    units = text.encode("utf-16-le", "surrogatepass")[:2 * length]
    return "".join(chr(units[i]) if units[i + 1] == 0 and chr(units[i]).isascii()
                   and chr(units[i]).isalnum() else "_" for i in range(0, len(units), 2))


class CompletedKeys:
    """Idempotency keys whose handler completed, remembered for the queue's retention."""

    def __init__(self, db: Database, retention: timedelta = KEY_RETENTION) -> None:
        self.db = db
        self.retention = retention

    def done(self, key: str, *, now: datetime | None = None) -> bool:
        with self.db.transaction() as tx:
            return tx.fetchone(Q.key_completed, {"key": key, "now": now or utcnow()}) is not None

    def complete(self, key: str, topic: str, message_id: str, *,
                 now: datetime | None = None) -> None:
        self.complete_many([(key, topic, message_id)], now=now)

    def done_many(self, keys: list[str], *, now: datetime | None = None) -> set[str]:
        """Which of ``keys`` completed (one query for a whole batch)."""
        if not keys:
            return set()
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.keys_completed, {"keys": tx.json(keys), "now": now or utcnow()},
                               final=True)
        return {row["key"] for row in rows}

    def complete_many(self, done: list[tuple[str, str, str]], *,
                      now: datetime | None = None) -> None:
        """``(key, topic, message_id)`` triples, in one transaction.

        Each write also retires a bounded number of expired keys, so the table stays
        bounded by the retention without a job of its own.
        """
        now = now or utcnow()
        with self.db.transaction() as tx:
            tx.executemany(Q.complete_key, [
                {"key": key, "topic": topic, "message_id": message_id, "now": now,
                 "expires_at": now + self.retention} for key, topic, message_id in done])
            tx.write(Q.delete_expired_keys, {"now": now, "limit": EXPIRED_KEYS_PER_WRITE})

    def delete_expired(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        with self.db.transaction() as tx:
            return tx.execute(Q.delete_expired_keys, {"now": now or utcnow(), "limit": limit})


class RedisCompletedKeys:
    """The same, in Redis (``queue:completed:<key>`` with the retention as its TTL).

    Used when Redis is configured: no write transaction to commit per batch. Each
    call is one EVAL, so a batch costs two round trips whatever its size.
    """

    DONE = ("local found = {} for i, k in ipairs(KEYS) do "
            "if redis.call('EXISTS', k) == 1 then found[#found + 1] = i end end return found")
    COMPLETE = ("for i, k in ipairs(KEYS) do redis.call('SET', k, ARGV[i + 1], 'EX', ARGV[1]) "
                "end return #KEYS")

    def __init__(self, redis: Any, retention: timedelta = KEY_RETENTION) -> None:
        self.redis = redis
        self.retention = retention

    @staticmethod
    def _name(key: str) -> str:
        return f"queue:completed:{key}"

    def done(self, key: str) -> bool:
        return bool(self.done_many([key]))

    def done_many(self, keys: list[str]) -> set[str]:
        if not keys:
            return set()
        found = self.redis.eval(self.DONE, [self._name(k) for k in keys], [])
        return {keys[int(i) - 1] for i in found or ()}

    def complete(self, key: str, topic: str, message_id: str) -> None:
        self.complete_many([(key, topic, message_id)])

    def complete_many(self, done: list[tuple[str, str, str]]) -> None:
        if done:
            self.redis.eval(self.COMPLETE, [self._name(k) for k, _, _ in done],
                            [int(self.retention.total_seconds()),
                             *(f"{topic} {message_id}" for _, topic, message_id in done)])


class KeyStore(Protocol):
    def done(self, key: str) -> bool: ...

    def done_many(self, keys: list[str]) -> set[str]: ...

    def complete(self, key: str, topic: str, message_id: str) -> None: ...

    def complete_many(self, done: list[tuple[str, str, str]]) -> None: ...


def completed_keys(services: Services) -> KeyStore:
    """Redis when configured, else the SQL store."""
    if services.settings.redis_configured:
        return RedisCompletedKeys(services.redis)
    return CompletedKeys(services.db)

