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
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Literal, NamedTuple, TypedDict

from sluice.core.errors import RequestError, TransientStoreError
from sluice.core.times import iso_z
from sluice.jobs.registry import NO_FENCE, Fence
from sluice.store.db import Database, Tx, load_queries, utcnow
from sluice.store.deadline import reserving
from sluice.store.redis_clients import (
    LEDGER_RETRY_DLQ as RETRY_DLQ,
)
from sluice.store.redis_clients import (
    LEDGER_RETRY_PROCESSING as RETRY_PROCESSING,
)
from sluice.store.redis_clients import (
    LEDGER_RETRY_QUEUE as RETRY_QUEUE,
)
from sluice.store.redis_clients import (
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
        _check_fields(self.id, self.model, self.tenant_id, self.user_id, self.input_tokens,
                      self.output_tokens, self.cost_micros)
        if not isinstance(self.occurred_at, datetime) or self.occurred_at.tzinfo is None:
            raise RequestError("usage entry occurred_at must be a timezone-aware datetime",
                               field="occurredAt")

    def to_contract(self) -> dict[str, Any]:
        """The camelCase ``entry`` object of a Redis retry envelope."""
        return {"id": self.id, "tenantId": self.tenant_id, "userId": self.user_id,
                "model": self.model, "inputTokens": self.input_tokens,
                "outputTokens": self.output_tokens, "costMicros": self.cost_micros,
                "occurredAt": iso(self.occurred_at)}

    @classmethod
    def from_contract(cls, data: Any, *, fallback_id: str | None = None) -> UsageEntry:
        """Parse an envelope's ``entry``; ``RequestError`` says what is wrong with it."""
        occurred = _contract_time(data)
        return cls(id=data.get("id", fallback_id), model=data.get("model"),
                   occurred_at=occurred, tenant_id=data.get("tenantId"),
                   user_id=data.get("userId"), input_tokens=data.get("inputTokens", 0),
                   output_tokens=data.get("outputTokens", 0),
                   cost_micros=data.get("costMicros", 0))

    @classmethod
    def from_row(cls, row: LedgerRow) -> UsageEntry:
        return cls(id=row["id"], model=row["model"],
                   occurred_at=datetime.fromisoformat(row["occurred_at"]),
                   tenant_id=row["tenant_id"], user_id=row["user_id"],
                   input_tokens=row["input_tokens"], output_tokens=row["output_tokens"],
                   cost_micros=row["cost_micros"])

    def ledger_row(self) -> LedgerRow:
        return {"id": self.id, "tenant_id": self.tenant_id, "user_id": self.user_id,
                "model": self.model, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens, "cost_micros": self.cost_micros,
                "occurred_at": _store_ts(self.occurred_at)}


class LedgerRow(TypedDict):
    """A ledger row as ``write_usage`` reads it (``occurred_at`` as timestamptz text)."""

    id: str
    tenant_id: str | None
    user_id: str | None
    model: str
    input_tokens: int
    output_tokens: int
    cost_micros: int
    occurred_at: str


def _check_fields(entry_id: Any, model: Any, tenant_id: Any, user_id: Any, input_tokens: Any,
                  output_tokens: Any, cost_micros: Any) -> None:
    """The checks of a ``UsageEntry`` but its time, for the entry and for a contract row."""
    if (type(entry_id) is str and entry_id and type(model) is str and model
            and (tenant_id is None or type(tenant_id) is str)
            and (user_id is None or type(user_id) is str)
            and type(input_tokens) is int and 0 <= input_tokens <= INT_MAX
            and type(output_tokens) is int and 0 <= output_tokens <= INT_MAX
            and type(cost_micros) is int and 0 <= cost_micros <= BIGINT_MAX):
        return  # the usual entry, in one expression; the checks below say what is wrong
    if not isinstance(entry_id, str) or not entry_id:
        raise RequestError("usage entry id must be a non-empty string", field="id")
    if not isinstance(model, str) or not model:
        raise RequestError("usage entry model must be a non-empty string", field="model")
    if tenant_id is not None and not isinstance(tenant_id, str):
        raise RequestError("usage entry tenant_id must be a string or null", field="tenantId")
    if user_id is not None and not isinstance(user_id, str):
        raise RequestError("usage entry user_id must be a string or null", field="userId")
    for name, field, value, most in (
            ("input_tokens", "inputTokens", input_tokens, INT_MAX),
            ("output_tokens", "outputTokens", output_tokens, INT_MAX),
            ("cost_micros", "costMicros", cost_micros, BIGINT_MAX)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RequestError(f"usage entry {name} must be a whole number >= 0", field=field)
        if value > most:
            raise RequestError(f"usage entry {name} is larger than {most}", field=field)


def _contract_time(data: Any) -> datetime:
    """The ``occurredAt`` of a contract ``entry`` (UTC when it names no offset)."""
    if not isinstance(data, dict):
        raise RequestError("entry is not an object")
    raw_time = data.get("occurredAt")
    if not isinstance(raw_time, str):
        raise RequestError("entry.occurredAt is not a string")
    try:
        occurred = datetime.fromisoformat(raw_time)
    except ValueError:
        raise RequestError(f"entry.occurredAt is not an ISO timestamp: {raw_time!r}") from None
    return occurred if occurred.tzinfo is not None else occurred.replace(tzinfo=UTC)


# UTC times that Postgres reads as the very instant ``datetime.fromisoformat`` reads (the
# producers' ``iso_z`` form among them): such an ``occurredAt`` is sent as written.
_PLAIN_UTC = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}"
                        r"(?:\.[0-9]{1,6})?(?:Z|\+00:00)")


def ledger_row_from_contract(data: Any, *, fallback_id: str | None = None) -> LedgerRow:
    """``UsageEntry.from_contract(data, ...).ledger_row()`` with the same checks and the
    same errors, without building the entry (ledger-redrive does this for every entry).
    ``occurred_at`` is ``occurredAt`` as written when it is plain UTC, else the instant
    in ``_store_ts`` form; ``write_rows`` normalises it for SQLite."""
    occurred = _contract_time(data)
    get = data.get
    row: LedgerRow = {
        "id": get("id", fallback_id), "tenant_id": get("tenantId"), "user_id": get("userId"),
        "model": get("model"), "input_tokens": get("inputTokens", 0),
        "output_tokens": get("outputTokens", 0), "cost_micros": get("costMicros", 0),
        "occurred_at": data["occurredAt"]}
    _check_fields(row["id"], row["model"], row["tenant_id"], row["user_id"],
                  row["input_tokens"], row["output_tokens"], row["cost_micros"])
    if not _PLAIN_UTC.fullmatch(row["occurred_at"]):
        row["occurred_at"] = _store_ts(occurred)
    return row


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
                  fence: Fence | None = None, now: datetime | None = None) -> Written:
    """``write_rows`` of the entries' ledger rows."""
    return write_rows(db, [e.ledger_row() for e in entries], fence=fence, now=now)


def write_rows(db: Database, rows: list[LedgerRow], *, fence: Fence | None = None,
               now: datetime | None = None) -> Written:
    """Insert ledger rows idempotently, with the outbox rows of those that are new.

    One transaction whatever the batch size: one statement on Postgres, three on SQLite.
    Ids already in the ledger are skipped, outbox row and all; entries of an erased user
    are dropped. ``fence`` (a job run's) is checked in the same transaction. The rows
    come from ``UsageEntry.ledger_row`` or ``ledger_row_from_contract`` (checked). The rows'
    ``created_at`` is ``now`` (the application's clock, not the database's).
    """
    if not rows:
        return Written(set(), set())
    fence = fence or NO_FENCE
    now = now or utcnow()
    with db.transaction() as tx:
        if tx.dialect == "postgres":
            row = tx.fetchone(Q.write_usage, {
                **fence.bind(tx), "rows": tx.json(rows),
                "id_suffix": OUTBOX_ID_SUFFIX, "event_name": METERING_EVENT_NAME, "now": now},
                final=True)
            assert row is not None
        else:
            fence.check(tx)
            row = _write_apart(tx, [UsageEntry.from_row(r) for r in rows], now)
    fence.confirm([row])
    return Written(set(row["inserted"]), set(row["erased"]))


def _write_apart(tx: Tx, batch: list[UsageEntry], now: datetime) -> dict[str, Any]:
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
                           {"rows": tx.json([e.ledger_row() for e in keep]), "now": now})
        inserted = {row["id"] for row in rows}
    outbox = [row for e in keep if e.id in inserted and (row := metering_row(e))
              and row["external_customer_id"] not in gone]
    if outbox:
        tx.execute(Q.insert_outbox_rows, {"rows": tx.json(outbox), "now": now})
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
        get = data.get
        envelope_id, entry, attempts = get("id"), get("entry"), get("attempts", 0)
        if not isinstance(envelope_id, str) or not envelope_id:
            raise RequestError("no string id")
        if not isinstance(entry, dict):
            raise RequestError("no entry object")
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
            raise RequestError("attempts is not a whole number")
        last_error = get("lastError")
        return cls(envelope_id, attempts, str(get("enqueuedAt") or ""),
                   last_error if isinstance(last_error, str) else None, entry)


def dead_letter(raw: str, reason: str, now: datetime) -> str:
    """A DLQ item: the envelope (or the raw text if it was not one) with why and when."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # kept as raw text: nested past the parser's depth
        data = None
    if not isinstance(data, dict):
        data = {"id": None, "raw": raw}
    data["reason"] = reason
    data["deadLetteredAt"] = iso(now)
    return json.dumps(data, separators=(",", ":"))


# --- The producer -------------------------------------------------------------

Recorded = Literal["recorded", "duplicate", "queued", "erased"]
# Inside a time bound (an app's request path), the share of it kept for the Redis push
# when Postgres does not answer: Postgres gets two thirds, the fallback the last third.
FALLBACK_SHARE = 1 / 3


def record_usage(entry: UsageEntry, *, db: Database, redis: RedisClient | None,
                 now: datetime | None = None) -> Recorded:
    """Write one ledger row (and its outbox row when billable) in one transaction.

    If Postgres is unreachable, the entry goes to the Redis retry queue instead and
    ``"queued"`` is returned; any other error, or no Redis to fall back on, raises.
    An entry of an erased user is dropped: ``"erased"``.
    """
    try:
        with reserving(FALLBACK_SHARE):  # inside a bound, the Redis push keeps its share
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
