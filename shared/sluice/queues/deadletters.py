"""Where push-queue messages go when they cannot run, and the dead-letter sources over them.

- ``<topic>-dlq``: a message whose handler failed ``MAX_ATTEMPTS`` times (the consumer's
  summary), or one the queue's own redrive policy moved (the raw message). On SQS the
  topic's DLQ queue; in process the ``queue_dead_letters`` table.
- the quarantine (``queue_quarantine``, on both modes): a message the consumer rejected
  (malformed, forged, misrouted, or signed with a secret it does not hold). It is
  acknowledged on its queue but kept here, never in a ``-dlq``.

A redrive puts back only a message whose signature verifies against a current or
retired secret (re-signed with the current one; its dedupe key is unchanged, so a
message that meanwhile completed does not run twice); anything else is refused with
the reason and stays where it is.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sluice.core.deadletters import (
    DeadLetter,
    DeadLetterSource,
    RedriveReport,
    choose,
    newest_first,
    redrive_each,
)
from sluice.queues.publish import Publisher, js_iso
from sluice.queues.signing import SIGNATURE_FIELD
from sluice.queues.sqs import Sqs
from sluice.queues.topics import TOPICS, get_topic
from sluice.store.db import Database, load_queries, utcnow

if TYPE_CHECKING:
    from sluice.core.services import Services

Q = load_queries("queues")

QUARANTINE = "quarantine"
MAX_SCAN = 500  # letters read to find ids, or to list
PEEK_HIDE_S = 30  # how long a peeked SQS dead letter stays hidden if the release fails


# --- the tables --------------------------------------------------------------------------


class LocalDeadLetters:
    """The ``<topic>-dlq`` of the not-provisioned mode: rows in ``queue_dead_letters``."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, topic: str, summary: Mapping[str, Any]) -> str:
        entry_id = str(uuid.uuid4())
        with self.db.transaction() as tx:
            tx.execute(Q.dead_letter_add, {"id": entry_id, "topic": topic,
                                           "summary": tx.json(dict(summary)),
                                           "failed_at": utcnow()})
        return entry_id

    def list(self, topic: str, limit: int) -> list[dict[str, Any]]:
        with self.db.transaction() as tx:
            return tx.fetchall(Q.dead_letter_list, {"topic": topic, "limit": limit})

    def get(self, topic: str, entry_id: str) -> dict[str, Any] | None:
        with self.db.transaction() as tx:
            return tx.fetchone(Q.dead_letter_get, {"topic": topic, "id": entry_id})

    def delete(self, topic: str, entry_id: str) -> bool:
        with self.db.transaction() as tx:
            return tx.execute(Q.dead_letter_delete, {"topic": topic, "id": entry_id}) > 0

    def count(self, topic: str) -> int:
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.dead_letter_count, {"topic": topic})
        return int(row["n"]) if row else 0

    def purge(self, topic: str) -> int:
        with self.db.transaction() as tx:
            return tx.execute(Q.dead_letter_purge, {"topic": topic})


# Characters neither store can hold in text (Postgres refuses NUL; lone surrogates are not
# UTF-8): a quarantined body keeps them as ``\\uXXXX`` escapes.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    return _UNSTORABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class Quarantine:
    """Rejected messages, kept as received (``queue_quarantine``), one row per message id;
    characters no store can hold are kept as escapes (``storable``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, topic: str, message_id: str | None, reason: str, body: str, *,
            now: datetime | None = None) -> str:
        entry_id = message_id or str(uuid.uuid4())
        with self.db.transaction() as tx:
            tx.execute(Q.quarantine_add, {"id": entry_id, "topic": topic,
                                          "message_id": message_id, "reason": reason,
                                          "body": storable(body),
                                          "received_at": now or utcnow()})
        return entry_id

    def list(self, limit: int) -> list[dict[str, Any]]:
        with self.db.transaction() as tx:
            return tx.fetchall(Q.quarantine_list, {"limit": limit})

    def get(self, entry_id: str) -> dict[str, Any] | None:
        with self.db.transaction() as tx:
            return tx.fetchone(Q.quarantine_get, {"id": entry_id})

    def delete(self, entry_id: str) -> bool:
        with self.db.transaction() as tx:
            return tx.execute(Q.quarantine_delete, {"id": entry_id}) > 0

    def count(self) -> int:
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.quarantine_count)
        return int(row["n"]) if row else 0

    def purge(self) -> int:
        with self.db.transaction() as tx:
            return tx.execute(Q.quarantine_purge)


# --- the letters ---------------------------------------------------------------------------


def _ms_iso(ms: str | None) -> str | None:
    if not ms or not ms.isdigit():
        return None
    return js_iso(datetime.fromtimestamp(int(ms) / 1000, UTC))


def topic_letter(topic: str, entry_id: str, raw: str, sent_ms: str | None = None,
                 ) -> DeadLetter:
    """A topic DLQ body: the consumer's summary, or (the redrive-policy backstop) the message."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return DeadLetter(entry_id, topic, "unreadable dead letter", _ms_iso(sent_ms),
                          {"raw": raw}, raw)
    if isinstance(body.get("originalMessage"), dict):
        original_id = body.get("originalMessageId")
        return DeadLetter(entry_id, topic, str(body.get("errorMessage") or ""),
                          body.get("failedAt") or _ms_iso(sent_ms), body, raw,
                          aliases=(original_id,) if isinstance(original_id, str) else ())
    return DeadLetter(entry_id, topic, "exceeded the queue's maxReceiveCount (redrive policy)",
                      _ms_iso(sent_ms), {"originalMessage": body}, raw)


def quarantine_letter(row: Mapping[str, Any]) -> DeadLetter:
    raw = str(row["body"])
    try:
        message = json.loads(raw)
    except ValueError:
        message = None
    at = row["received_at"]
    return DeadLetter(str(row["id"]), QUARANTINE, str(row["reason"]),
                      js_iso(at) if isinstance(at, datetime) else at,
                      {"topic": row["topic"], "messageId": row["message_id"],
                       "message": message if isinstance(message, dict) else None, "raw": raw},
                      raw)


# --- putting messages back -------------------------------------------------------------------


class Republisher:
    """Vets a message for a redrive and publishes it (the publisher is built on first use)."""

    def __init__(self, publisher: Callable[[], Publisher], services: Services) -> None:
        self._publisher = publisher
        self.services = services

    @property
    def publisher(self) -> Publisher:
        return self._publisher()

    def vet(self, message: Any, topic: str) -> str | None:
        if not isinstance(message, dict):
            return "no original message to redrive"
        if message.get("topic") != topic:
            return f"message topic {message.get('topic')!r} is not {topic!r}"
        if get_topic(topic).reserved:
            return f"{topic} consumer is not implemented; nothing is published to it"
        reason = self.publisher.signer.check(message)
        if reason is not None:
            return f"does not verify against a current or retired secret ({reason})"
        return None

    def send(self, message: dict[str, Any]) -> dict[str, Any]:
        publisher = self.publisher
        signed = publisher.signer.sign({k: v for k, v in message.items() if k != SIGNATURE_FIELD})
        published = publisher.send_signed(signed)
        return {"messageId": published.message_id, "idempotencyKey": published.idempotency_key}

    def report(self, queue: str) -> Callable[[DeadLetter, Exception], None]:
        def on_error(letter: DeadLetter, exc: Exception) -> None:
            self.services.reporter.error("dlq.redrive", exc, queue=queue, id=letter.id)

        return on_error


# --- the sources -------------------------------------------------------------------------------


class LocalTopicDeadLetters:
    """A topic's DLQ in process: the ``queue_dead_letters`` rows of that topic."""

    def __init__(self, topic: str, table: LocalDeadLetters, republisher: Republisher) -> None:
        self.name = topic
        self.table = table
        self.republisher = republisher

    def show(self, entry_id: str) -> DeadLetter | None:
        found = choose(self.list(MAX_SCAN), [entry_id], 1)
        return found[0] if found else None

    def _send(self, letter: DeadLetter) -> dict[str, Any]:
        sent = self.republisher.send(letter.body["originalMessage"])
        self.table.delete(self.name, letter.id)  # only once the publish succeeded
        return {"id": letter.id, **sent}

    def redrive(self, ids: list[str] | None, limit: int, *, dry_run: bool,
                pace: Callable[[], None]) -> RedriveReport:
        chosen = choose(self.list(MAX_SCAN if ids else limit), ids, limit)
        return redrive_each(chosen, ids, dry_run=dry_run, pace=pace,
                            vet=lambda d: self.republisher.vet(d.body.get("originalMessage"),
                                                               self.name),
                            send=self._send, on_error=self.republisher.report(self.name))

    def purge(self, ids: list[str] | None) -> int:
        if ids is None:
            return self.table.purge(self.name)
        return sum(self.table.delete(self.name, d.id)
                   for d in choose(self.list(MAX_SCAN), ids, MAX_SCAN))

    def depth(self) -> int:
        return self.table.count(self.name)

    def list(self, limit: int) -> list[DeadLetter]:
        return newest_first(topic_letter(self.name, row["id"], json.dumps(row["summary"]))
                            for row in self.table.list(self.name, limit))


class SqsTopicDeadLetters:
    """A topic's DLQ on SQS. Reading receives letters hidden briefly, then releases them."""

    def __init__(self, topic: str, sqs: Callable[[], Sqs], republisher: Republisher) -> None:
        self.name = topic
        self._sqs = sqs
        self.republisher = republisher

    @property
    def sqs(self) -> Sqs:
        return self._sqs()

    def _peek(self, limit: int) -> list[DeadLetter]:
        """Up to ``limit`` dead letters, newest first, held (the caller releases them)."""
        url = self.sqs.dlq_url(self.name)
        found: dict[str, DeadLetter] = {}
        for _ in range(limit // 10 + 3):
            batch = self.sqs.receive(url, max_messages=min(10, limit - len(found)) or 1,
                                     visibility=PEEK_HIDE_S)
            if not batch:
                break
            for message in batch:
                letter = topic_letter(self.name, message["MessageId"], message["Body"],
                                      message.get("Attributes", {}).get("SentTimestamp"))
                letter.handle = message["ReceiptHandle"]
                found[letter.id] = letter
            if len(found) >= limit:
                break
        return newest_first(found.values())

    def _release(self, letters: list[DeadLetter]) -> None:
        url = self.sqs.dlq_url(self.name)
        for letter in letters:
            if letter.handle:
                self.sqs.change_visibility(url, letter.handle, 0)

    def show(self, entry_id: str) -> DeadLetter | None:
        letters = self._peek(MAX_SCAN)
        self._release(letters)
        found = choose(letters, [entry_id], 1)
        return found[0] if found else None

    def _send(self, letter: DeadLetter) -> dict[str, Any]:
        sent = self.republisher.send(letter.body["originalMessage"])
        if letter.handle:  # only once the publish succeeded
            self.sqs.delete(self.sqs.dlq_url(self.name), letter.handle)
        return {"id": letter.id, **sent}

    def redrive(self, ids: list[str] | None, limit: int, *, dry_run: bool,
                pace: Callable[[], None]) -> RedriveReport:
        letters = self._peek(MAX_SCAN if ids else limit)
        chosen = choose(letters, ids, limit)
        self._release([d for d in letters if d not in chosen])
        report = RedriveReport()
        try:
            report = redrive_each(chosen, ids, dry_run=dry_run, pace=pace,
                                  vet=lambda d: self.republisher.vet(
                                      d.body.get("originalMessage"), self.name),
                                  send=self._send, on_error=self.republisher.report(self.name))
        finally:
            # Whatever was not redriven (dry run, refusals, failures) becomes visible again.
            done = set() if dry_run else {r["id"] for r in report.redriven}
            self._release([d for d in chosen if d.id not in done])
        return report

    def purge(self, ids: list[str] | None) -> int:
        url = self.sqs.dlq_url(self.name)
        purged = 0
        while True:
            letters = self._peek(MAX_SCAN)
            chosen = choose(letters, ids, MAX_SCAN)
            self._release([d for d in letters if d not in chosen])
            for letter in chosen:
                if letter.handle:
                    self.sqs.delete(url, letter.handle)
                    purged += 1
            if ids is not None or not letters:
                return purged

    def depth(self) -> int:
        counts = self.sqs.depth(self.sqs.dlq_url(self.name))
        return counts["visible"] + counts["inFlight"] + counts["delayed"]

    def list(self, limit: int) -> list[DeadLetter]:
        letters = self._peek(limit)
        self._release(letters)
        return letters


class QuarantineDeadLetters:
    """Rejected messages of every topic. A redrive re-publishes only what now verifies."""

    name = QUARANTINE

    def __init__(self, table: Quarantine, republisher: Republisher) -> None:
        self.table = table
        self.republisher = republisher

    def show(self, entry_id: str) -> DeadLetter | None:
        row = self.table.get(entry_id)
        return None if row is None else quarantine_letter(row)

    def _vet(self, letter: DeadLetter) -> str | None:
        return self.republisher.vet(letter.body["message"], str(letter.body["topic"]))

    def _send(self, letter: DeadLetter) -> dict[str, Any]:
        sent = self.republisher.send(letter.body["message"])
        self.table.delete(letter.id)
        return {"id": letter.id, **sent}

    def redrive(self, ids: list[str] | None, limit: int, *, dry_run: bool,
                pace: Callable[[], None]) -> RedriveReport:
        chosen = choose(self.list(MAX_SCAN if ids else limit), ids, limit)
        return redrive_each(chosen, ids, dry_run=dry_run, pace=pace, vet=self._vet,
                            send=self._send, on_error=self.republisher.report(QUARANTINE))

    def purge(self, ids: list[str] | None) -> int:
        if ids is None:
            return self.table.purge()
        return sum(self.table.delete(i) for i in ids)

    def depth(self) -> int:
        return self.table.count()

    def list(self, limit: int) -> list[DeadLetter]:
        return newest_first(quarantine_letter(row) for row in self.table.list(limit))


def queue_sources(services: Services, publisher: Callable[[], Publisher],
                  sqs: Callable[[], Sqs]) -> dict[str, DeadLetterSource]:
    """Every topic's DLQ (on SQS or in process, as configured) and the quarantine."""
    republisher = Republisher(publisher, services)
    sources: dict[str, DeadLetterSource] = {}
    if services.settings.queue_mode == "sqs":
        for topic in TOPICS:
            sources[topic] = SqsTopicDeadLetters(topic, sqs, republisher)
    else:
        table = LocalDeadLetters(services.db)
        for topic in TOPICS:
            sources[topic] = LocalTopicDeadLetters(topic, table, republisher)
    sources[QUARANTINE] = QuarantineDeadLetters(Quarantine(services.db), republisher)
    return sources
