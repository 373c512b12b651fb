"""The AI usage ledger: ``record_usage`` (the producer) and the store both drains share.

One model call is one ledger row, idempotent on its client-supplied id. A billable
row brings one metering outbox row, written in the same transaction; metering-flush
sends it to Polar. When Postgres is unreachable (a ``TransientStoreError``, nothing
else), the producer parks the entry in the Redis retry queue and ledger-redrive
inserts it later, outbox row included, exactly as the producer would have.

Both paths honour erasure tombstones (``erasure_tombstones``): an entry whose user
was erased is dropped, never written (and a billable row whose customer was erased
brings no outbox row), so a copy that waited in Redis through the purge does not
bring the data back.

The formats here are public contracts (a TypeScript producer writes them too); the
docs/billing.md documents them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Literal, NamedTuple

from shared.core.errors import RequestError, TransientStoreError
from shared.core.times import iso_z
from shared.jobs.registry import NO_FENCE, Fence
from shared.store.db import Database, Tx, load_queries, utcnow
from shared.store.redis_clients import (
    LEDGER_RETRY_DLQ as RETRY_DLQ,
)
from shared.store.redis_clients import (
    LEDGER_RETRY_PROCESSING as RETRY_PROCESSING,
)
from shared.store.redis_clients import (
    LEDGER_RETRY_QUEUE as RETRY_QUEUE,
)
from shared.store.redis_clients import (
    RedisClient,
)

Q = load_queries("usage")

# Redis list names (the client puts the settings' key prefix in front).
RETRY_LISTS = (RETRY_QUEUE, RETRY_PROCESSING, RETRY_DLQ)

METERING_EVENT_NAME = "ai_usage"
OUTBOX_ID_SUFFIX = ":metering"
MAX_METERING_ATTEMPTS = 5
INT_MAX = 2**31 - 1  # the ledger's integer columns
BIGINT_MAX = 2**63 - 1


class OutboxStatus(str, Enum):
    PENDING = "pending"
    PROCESSED = "processed"
    FAILED = "failed"


iso = iso_z


def _store_ts(moment: datetime) -> str:
    # Parsed as timestamptz by Postgres and read back by the SQLite converter alike.
    # "%Y-%m-%d %H:%M:%S.%f+00:00", as isoformat writes it (twice as fast as strftime).
    return moment.astimezone(UTC).isoformat(sep=" ", timespec="microseconds")


@dataclass(frozen=True)
class UsageEntry:
    """One AI model call, as the ledger stores it."""

    id: str
    model: str
    occurred_at: datetime
    tenant_id: str | None = None
    user_id: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micros: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise RequestError("usage entry id must be a non-empty string")
        if not isinstance(self.model, str) or not self.model:
            raise RequestError("usage entry model must be a non-empty string")
        for name in ("tenant_id", "user_id"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise RequestError(f"usage entry {name} must be a string or null")
        for name, most in (("input_tokens", INT_MAX), ("output_tokens", INT_MAX),
                           ("cost_micros", BIGINT_MAX)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise RequestError(f"usage entry {name} must be a whole number >= 0")
            if value > most:
                raise RequestError(f"usage entry {name} is larger than {most}")
        if not isinstance(self.occurred_at, datetime) or self.occurred_at.tzinfo is None:
            raise RequestError("usage entry occurred_at must be a timezone-aware datetime")

    def to_contract(self) -> dict[str, Any]:
        """The camelCase ``entry`` object of a Redis retry envelope."""
        return {"id": self.id, "tenantId": self.tenant_id, "userId": self.user_id,
                "model": self.model, "inputTokens": self.input_tokens,
                "outputTokens": self.output_tokens, "costMicros": self.cost_micros,
                "occurredAt": iso(self.occurred_at)}

    @classmethod
    def from_contract(cls, data: Any, *, fallback_id: str | None = None) -> UsageEntry:
        """Parse an envelope's ``entry``; ``RequestError`` says what is wrong with it."""
        if not isinstance(data, dict):
            raise RequestError("entry is not an object")
        raw_time = data.get("occurredAt")
        if not isinstance(raw_time, str):
            raise RequestError("entry.occurredAt is not a string")
        try:
            occurred = datetime.fromisoformat(raw_time)
        except ValueError:
            raise RequestError(f"entry.occurredAt is not an ISO timestamp: {raw_time!r}") from None
        if occurred.tzinfo is None:
            occurred = occurred.replace(tzinfo=UTC)
        return cls(id=data.get("id", fallback_id), model=data.get("model"),  # type: ignore[arg-type]
                   occurred_at=occurred, tenant_id=data.get("tenantId"),
                   user_id=data.get("userId"), input_tokens=data.get("inputTokens", 0),
                   output_tokens=data.get("outputTokens", 0),
                   cost_micros=data.get("costMicros", 0))

    def ledger_row(self) -> dict[str, Any]:
        return {"id": self.id, "tenant_id": self.tenant_id, "user_id": self.user_id,
                "model": self.model, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens, "cost_micros": self.cost_micros,
                "occurred_at": _store_ts(self.occurred_at)}


def metering_row(entry: UsageEntry) -> dict[str, Any] | None:
    """The outbox row a ledger row brings, or None when it is not billable.

    Billable: a customer to bill (the tenant, else the user) and some usage (tokens or
    cost). The outbox id is derived from the ledger id, so writing it twice is harmless
    and it doubles as Polar's ``external_id``. On Postgres, ``write_usage`` builds the
    same row in SQL.
    """
    customer = entry.tenant_id or entry.user_id
    if not customer or not (entry.input_tokens or entry.output_tokens or entry.cost_micros):
        return None
    return {
        "id": entry.id + OUTBOX_ID_SUFFIX, "ledger_id": entry.id,
        "external_customer_id": customer, "event_name": METERING_EVENT_NAME,
        "metadata": {"model": entry.model, "input_tokens": entry.input_tokens,
                     "output_tokens": entry.output_tokens,
                     "total_tokens": entry.input_tokens + entry.output_tokens,
                     "cost_micros": entry.cost_micros, "ledger_id": entry.id},
    }


class Written(NamedTuple):
    inserted: set[str]  # ids inserted now
    erased: set[str]  # ids dropped: their user was erased (a tombstone names them)


def write_entries(db: Database, entries: Iterable[UsageEntry], *,
                  fence: Fence | None = None) -> Written:
    """Insert ledger rows idempotently, with the outbox rows of those that are new.

    One transaction whatever the batch size: one statement on Postgres, three on SQLite.
    Ids already in the ledger are skipped, outbox row and all; entries of an erased user
    are dropped. ``fence`` (a job run's) is checked in the same transaction.
    """
    batch = list(entries)
    if not batch:
        return Written(set(), set())
    fence = fence or NO_FENCE
    with db.transaction() as tx:
        if tx.dialect == "postgres":
            row = tx.fetchone(Q.write_usage, {
                **fence.bind(tx), "rows": tx.json([e.ledger_row() for e in batch]),
                "id_suffix": OUTBOX_ID_SUFFIX, "event_name": METERING_EVENT_NAME}, final=True)
            assert row is not None
        else:
            fence.check(tx)
            row = _write_apart(tx, batch)
    fence.confirm([row])
    return Written(set(row["inserted"]), set(row["erased"]))


def _write_apart(tx: Tx, batch: list[UsageEntry]) -> dict[str, Any]:
    """``write_usage`` as three statements, for SQLite (its statements cannot insert into
    two tables)."""
    people = sorted({p for e in batch for p in (e.user_id, e.tenant_id) if p})
    gone = {row["subject_user_id"] for row in tx.fetchall(
        Q.erased_subjects, {"ids": tx.json(people)})} if people else set()
    erased = {e.id for e in batch if e.user_id in gone}
    keep = [e for e in batch if e.id not in erased]
    inserted: set[str] = set()
    if keep:
        rows = tx.fetchall(Q.insert_ledger_rows,
                           {"rows": tx.json([e.ledger_row() for e in keep])})
        inserted = {row["id"] for row in rows}
    outbox = [row for e in keep if e.id in inserted and (row := metering_row(e))
              and row["external_customer_id"] not in gone]
    if outbox:
        tx.execute(Q.insert_outbox_rows, {"rows": tx.json(outbox)})
    return {"lease_held": True, "inserted": inserted, "erased": erased}


def insert_entries(db: Database, entries: Iterable[UsageEntry]) -> set[str]:
    """``write_entries``, returning the ids inserted now."""
    return write_entries(db, entries).inserted


# --- Redis retry envelopes ----------------------------------------------------


class RetryEnvelope(NamedTuple):
    """``{"id", "attempts", "enqueuedAt", "lastError", "entry"}`` in the retry lists."""

    id: str
    attempts: int
    enqueued_at: str
    last_error: str | None
    entry: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "attempts": self.attempts,
                           "enqueuedAt": self.enqueued_at, "lastError": self.last_error,
                           "entry": self.entry}, separators=(",", ":"))

    @classmethod
    def for_entry(cls, entry: UsageEntry, *, last_error: str | None,
                  now: datetime | None = None) -> RetryEnvelope:
        return cls(id=entry.id, attempts=0, enqueued_at=iso(now or utcnow()),
                   last_error=last_error, entry=entry.to_contract())

    @classmethod
    def parse(cls, raw: str) -> RetryEnvelope:
        """Parse a list item; ``RequestError`` names why it is malformed."""
        try:
            data = json.loads(raw)
        except ValueError:
            raise RequestError("not JSON") from None
        if not isinstance(data, dict):
            raise RequestError("not a JSON object")
        if not isinstance(data.get("id"), str) or not data["id"]:
            raise RequestError("no string id")
        if not isinstance(data.get("entry"), dict):
            raise RequestError("no entry object")
        attempts = data.get("attempts", 0)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
            raise RequestError("attempts is not a whole number")
        last_error = data.get("lastError")
        return cls(id=data["id"], attempts=attempts,
                   enqueued_at=str(data.get("enqueuedAt") or ""),
                   last_error=last_error if isinstance(last_error, str) else None,
                   entry=data["entry"])


def dead_letter(raw: str, reason: str, now: datetime) -> str:
    """A DLQ item: the envelope (or the raw text if it was not one) with why and when."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        data = {"id": None, "raw": raw}
    data["reason"] = reason
    data["deadLetteredAt"] = iso(now)
    return json.dumps(data, separators=(",", ":"))


# --- The producer -------------------------------------------------------------

Recorded = Literal["recorded", "duplicate", "queued", "erased"]


def record_usage(entry: UsageEntry, *, db: Database, redis: RedisClient | None,
                 now: datetime | None = None) -> Recorded:
    """Write one ledger row (and its outbox row when billable) in one transaction.

    If Postgres is unreachable, the entry goes to the Redis retry queue instead and
    ``"queued"`` is returned; any other error, or no Redis to fall back on, raises.
    An entry of an erased user is dropped: ``"erased"``.
    """
    try:
        written = write_entries(db, [entry])
    except TransientStoreError as exc:
        if redis is None:
            raise
        envelope = RetryEnvelope.for_entry(entry, last_error=f"{exc.code}: {exc.message}", now=now)
        redis.lpush(RETRY_QUEUE, envelope.to_json())
        return "queued"
    if entry.id in written.erased:
        return "erased"
    return "recorded" if entry.id in written.inserted else "duplicate"


# --- Figures for the operations surface ---------------------------------------


def usage_figures(db: Database, redis: RedisClient | None) -> dict[str, Any]:
    """Real depths of the metering outbox and of the ledger retry lists (None: no Redis)."""
    with db.transaction() as tx:
        row = tx.fetchone(Q.outbox_figures, {"max_attempts": MAX_METERING_ATTEMPTS}) or {}
    oldest = row.get("oldest_eligible_at")
    if isinstance(oldest, str):  # SQLite hands back min() of timestamptz as text
        oldest = datetime.fromisoformat(oldest)
    outbox = {"pending": int(row.get("pending") or 0),
              "processed": int(row.get("processed") or 0),
              "retrying": int(row.get("retrying") or 0),
              "exhausted": int(row.get("exhausted") or 0),
              "oldestEligibleAt": iso(oldest) if oldest else None}
    lists = None if redis is None else {
        "queue": redis.llen(RETRY_QUEUE), "processing": redis.llen(RETRY_PROCESSING),
        "dlq": redis.llen(RETRY_DLQ)}
    return {"meteringOutbox": outbox, "ledgerRetry": lists}
