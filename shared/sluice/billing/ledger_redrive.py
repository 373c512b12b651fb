"""ledger-redrive: insert the AI usage ledger entries that waited in Redis for Postgres.

Three lists (queue, processing, dlq; see ``sluice.store.redis_clients``). Each run:

1. **reclaim**: everything stranded in processing by a crashed run goes back to the
   queue (ledger inserts are idempotent on the entry id, so a second insert of a
   reclaimed entry cannot double-count);
2. **claim** up to ``batch_size`` entries with ``LMOVE`` queue→processing, never a pop,
   so a crash after the claim leaves every entry recoverable;
3. **insert** the batch into the ledger (and its outbox rows) in one transaction (one
   statement on Postgres, the run's fence inside it); entries of an erased user (a
   tombstone names them) are dropped and counted in ``erased``;
4. **settle**: remove each entry from processing, and in the same atomic step put a
   failed one back on the queue or, at ``MAX_ATTEMPTS`` or when malformed, on the DLQ.

Steps 2-4 repeat, a batch at a time, until the queue is empty or the deadline passes.
Only an entry Postgres refused counts an attempt (``attempts`` + 1): when Postgres is
unreachable (a ``TransientStoreError``) the batch goes back unchanged and the run
stops, so an outage of any length dead-letters nothing.

Steps 1, 2 and 4 are Lua scripts (``EVAL``, which redis-py and Upstash REST both
speak): a batch of 100 costs three round trips on Postgres (claim, insert, settle), not
300, while each entry is still moved by one atomic command. A run checks its fence
before the first claim; after that, the insert that found the lease held stands for the
check before the next claim (a batch without an insert is followed by a check). A crash at any point leaves an entry in the queue,
in processing, or in the ledger (and possibly still in processing, to be reclaimed and
inserted again as a no-op).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from sluice.billing.usage import (
    LedgerRow,
    RetryEnvelope,
    dead_letter,
    ledger_row_from_contract,
    write_rows,
)
from sluice.core.crash import crash_point
from sluice.core.errors import PermanentStoreError, RequestError, TransientStoreError
from sluice.jobs.registry import Deadline, Fence, JobContext, Result
from sluice.store.db import Database
from sluice.store.redis_clients import (
    LEDGER_RETRY_DLQ,
    LEDGER_RETRY_PROCESSING,
    LEDGER_RETRY_QUEUE,
    RedisClient,
)

DEFAULT_REDRIVE_BATCH_SIZE = 100
MAX_ATTEMPTS = 10
RECLAIM_CHUNK = 5_000  # entries moved per EVAL, so one script never holds Redis for long
MAX_BATCHES_PER_RUN = 1_000
MAX_ERROR_MESSAGES = 20

# KEYS: processing, queue. ARGV: how many at most. Newest claim first onto the queue's
# right end, so the oldest ends up rightmost again: the queue order survives a reclaim.
RECLAIM_SCRIPT = """
local moved = 0
local most = tonumber(ARGV[1])
while moved < most do
  if not redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT') then break end
  moved = moved + 1
end
return moved
"""

# KEYS: queue, processing. ARGV: how many at most. The oldest entry is the queue's right end.
CLAIM_SCRIPT = """
local claimed = {}
for i = 1, tonumber(ARGV[1]) do
  local item = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
  if not item then break end
  claimed[i] = item
end
return claimed
"""

# KEYS: processing, queue, dlq. ARGV: n, then the n acknowledged items, then triples
# (op, claimed item, replacement) with op requeue | dlq. Removal and re-push happen
# together; an item that is no longer in processing (reclaimed meanwhile) is not pushed
# again. Acknowledged items go newest claim first: each is then found at the list's head.
SETTLE_SCRIPT = """
local acked, requeued, dead = 0, 0, 0
local n = tonumber(ARGV[1])
for i = n + 1, 2, -1 do
  acked = acked + redis.call('LREM', KEYS[1], 1, ARGV[i])
end
for i = n + 2, #ARGV, 3 do
  local op, item, replacement = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if redis.call('LREM', KEYS[1], 1, item) > 0 then
    if op == 'requeue' then
      redis.call('LPUSH', KEYS[2], replacement)
      requeued = requeued + 1
    else
      redis.call('LPUSH', KEYS[3], replacement)
      dead = dead + 1
    end
  end
end
return {acked, requeued, dead}
"""

Op = Literal["ack", "requeue", "dlq"]


class Settlement:
    """What to do with each claimed item, decided before anything is written to Redis."""

    __slots__ = ("erased", "errors", "fenced", "steps", "stop")

    def __init__(self) -> None:
        self.steps: list[tuple[Op, str, str]] = []
        self.errors: list[str] = []
        self.stop = False
        self.erased = 0
        self.fenced = False  # a statement of this batch found the run's lease held

    def ack(self, raw: str) -> None:
        self.steps.append(("ack", raw, ""))

    def dead(self, raw: str, reason: str, now: datetime) -> None:
        self.steps.append(("dlq", raw, dead_letter(raw, reason, now)))

    def later(self, raw: str, envelope: RetryEnvelope, error: str) -> None:
        """Back on the queue with its attempts unchanged: the store, not the entry, failed."""
        retried = RetryEnvelope(envelope.id, envelope.attempts, envelope.enqueued_at, error,
                                envelope.entry)
        self.steps.append(("requeue", raw, retried.to_json()))

    def failed(self, raw: str, envelope: RetryEnvelope, error: str, now: datetime) -> None:
        attempts = envelope.attempts + 1
        retried = RetryEnvelope(envelope.id, attempts, envelope.enqueued_at, error, envelope.entry)
        if attempts >= MAX_ATTEMPTS:
            self.steps.append(("dlq", raw, dead_letter(retried.to_json(), "max_attempts", now)))
        else:
            self.steps.append(("requeue", raw, retried.to_json()))

    def error(self, message: str) -> None:
        if len(self.errors) < MAX_ERROR_MESSAGES:
            self.errors.append(message)


def reclaim(redis: RedisClient, *, chunk: int = RECLAIM_CHUNK) -> int:
    """Move everything in processing back to the queue; returns how many moved."""
    total = 0
    while True:
        moved = int(redis.eval(RECLAIM_SCRIPT, [LEDGER_RETRY_PROCESSING, LEDGER_RETRY_QUEUE],
                               [chunk]))
        total += moved
        if moved < chunk:
            return total


def claim(redis: RedisClient, count: int) -> list[str]:
    items = redis.eval(CLAIM_SCRIPT, [LEDGER_RETRY_QUEUE, LEDGER_RETRY_PROCESSING], [count])
    return [str(item) for item in items or []]


def settle(redis: RedisClient, steps: list[tuple[Op, str, str]]) -> tuple[int, int, int]:
    if not steps:
        return 0, 0, 0
    acks = [raw for op, raw, _ in steps if op == "ack"]
    args: list[str | int] = [len(acks), *acks]
    args.extend(part for step in steps if step[0] != "ack" for part in step)
    acked, requeued, dead = redis.eval(
        SETTLE_SCRIPT, [LEDGER_RETRY_PROCESSING, LEDGER_RETRY_QUEUE, LEDGER_RETRY_DLQ], args)
    return int(acked), int(requeued), int(dead)


def _parse(raw: str) -> tuple[RetryEnvelope, LedgerRow]:
    envelope = RetryEnvelope.parse(raw)
    row = ledger_row_from_contract(envelope.entry, fallback_id=envelope.id)
    if row["id"] != envelope.id:
        raise RequestError("entry.id does not match id")
    return envelope, row


def decide(db: Database, claimed: list[str], now: datetime, *,
           fence: Fence | None = None) -> Settlement:
    """Insert what can be inserted and say what becomes of every claimed item."""
    plan = Settlement()
    valid: list[tuple[str, RetryEnvelope, LedgerRow]] = []
    for raw in claimed:
        try:
            envelope, row = _parse(raw)
        except RequestError as exc:
            plan.dead(raw, f"malformed: {exc.message}", now)
            continue
        except Exception as exc:  # noqa: BLE001 - whatever one entry's text raises (nesting
            # past the parser's depth, a value no field accepts) is that entry's verdict
            plan.dead(raw, f"malformed: {type(exc).__name__}: {str(exc)[:200]}", now)
            continue
        valid.append((raw, envelope, row))
    if not valid:
        return plan
    try:
        written = write_rows(db, [row for _, _, row in valid], fence=fence)
    except TransientStoreError as exc:
        # Postgres is away: every entry waits for the next run, its attempts untouched.
        message = f"{exc.code}: {exc.message}"
        for raw, envelope, _ in valid:
            plan.later(raw, envelope, message)
        plan.error(message)
        plan.stop = True
        return plan
    except PermanentStoreError:
        # One entry poisons the batch: insert them one by one so only it pays.
        return _one_by_one(db, valid, plan, now, fence)
    crash_point("redrive.after_insert")
    plan.fenced = True
    plan.erased += len(written.erased)
    for raw, _, _ in valid:
        plan.ack(raw)
    return plan


def _one_by_one(db: Database, valid: list[tuple[str, RetryEnvelope, LedgerRow]],
                plan: Settlement, now: datetime, fence: Fence | None) -> Settlement:
    for raw, envelope, row in valid:
        if plan.stop:
            plan.later(raw, envelope, envelope.last_error or "not tried: the store failed")
            continue
        try:
            written = write_rows(db, [row], fence=fence)
        except TransientStoreError as exc:
            plan.later(raw, envelope, f"{exc.code}: {exc.message}")
            plan.error(f"{exc.code}: {exc.message}")
            plan.stop = True
        except PermanentStoreError as exc:
            plan.failed(raw, envelope, f"{exc.code}: {exc.message}", now)
            plan.error(f"{row['id']}: {exc.code}: {exc.message}")
        else:
            plan.erased += len(written.erased)
            plan.ack(raw)
    return plan


def redrive(redis: RedisClient, db: Database, *, now: datetime, deadline: Deadline,
            batch_size: int = DEFAULT_REDRIVE_BATCH_SIZE, max_batches: int | None = None,
            fence: Fence | None = None) -> Result:
    """Batches of ``batch_size`` until the queue is empty, the deadline passes, the store
    fails, or ``max_batches`` (None: no limit) have run."""
    result: Result = {"drained": 0, "succeeded": 0, "requeued": 0, "deadLettered": 0,
                      "erased": 0, "errors": [], "reason": None}
    reclaim(redis)
    crash_point("redrive.after_reclaim")
    batches = 0
    fenced = False  # the last batch's insert found the lease held: no check needed now
    while max_batches is None or batches < max_batches:
        if deadline.expired():
            result["reason"] = "deadline"
            break
        if fence is not None and not fenced:  # a lost lease stops the run before it claims
            with db.transaction() as tx:
                fence.check(tx)
        claimed = claim(redis, batch_size)
        if not claimed:
            break
        batches += 1
        crash_point("redrive.after_claim")
        result["drained"] += len(claimed)
        plan = decide(db, claimed, now, fence=fence)
        fenced = plan.fenced
        crash_point("redrive.before_ack")
        acked, requeued, dead = settle(redis, plan.steps)
        result["succeeded"] += acked - plan.erased
        result["erased"] += plan.erased
        result["requeued"] += requeued
        result["deadLettered"] += dead
        result["errors"].extend(plan.errors)
        if plan.stop:
            result["reason"] = "store_unavailable"
            break
        if len(claimed) < batch_size:
            break
    return result


def _batches(ctx: JobContext) -> int | None:
    raw = ctx.params.get("batches")
    if raw is None:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_BATCHES_PER_RUN:
        raise RequestError(f"batches must be a whole number from 1 to {MAX_BATCHES_PER_RUN}")
    return int(raw)


def run_ledger_redrive(ctx: JobContext) -> Result:
    redis: RedisClient | None = ctx.services.redis
    if redis is None:
        # Nothing can be waiting. The error names why nothing drained; it does not page,
        # because only ``deadLettered`` (billable spend lost for good) counts as a failure.
        return {"drained": 0, "succeeded": 0, "requeued": 0, "deadLettered": 0, "erased": 0,
                "errors": ["redis_not_configured"], "reason": "redis_not_configured"}
    return redrive(redis, ctx.services.db, now=ctx.started_at, deadline=ctx.deadline,
                   max_batches=_batches(ctx), fence=ctx.fence)
