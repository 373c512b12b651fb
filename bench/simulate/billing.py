"""AI usage through the real billing path, and invariant 3.

Each model call of the world is reported with ``record_usage``, as the API does: into the
ledger with its metering outbox row, or, while the SQL store is down, onto the Redis retry
queue that ``ledger-redrive`` inserts from later. While Redis is down too the call fails,
and the caller reports it again five minutes later (as a client retrying a 503 would):
only a call ``record_usage`` accepted is owed. ``metering-flush`` sends the outbox to the
Polar stand-in (``peers.py``).

The invariants, judged from what Polar received and from public state:

- ``metered_once``: Polar receives only the outbox rows of accepted calls, and each
  accepted call's row has reached it (deduplicated on ``external_id``: exactly once) by
  ``OWED_AFTER`` into the first stretch of that length, from its acceptance on, with Polar,
  the store and Redis up;
- ``ledger_once``: by the same time the call is in the ledger, exactly once;
- ``metered_right``: each event Polar receives describes its call as the world made it
  (docs/billing.md): the name ``ai_usage``, the tenant as the customer, the call's
  tokens in its metadata (input, output, total), and the moment the call happened as its
  timestamp (not when it was written or sent: a call that waited in Redis through a
  store outage is still billed for when it was made);
- (a call of a user erased meanwhile is owed to neither: the purge deletes its rows, and
  ``record_usage`` and ``ledger-redrive`` drop it; see ``erasure.py``)
- ``no_attempt_burned``: no outbox row ends with its attempts used up but those Polar
  refused (its own record of the 422s it gave), and no ledger entry is dead-lettered (no
  call is malformed): any other such row was burned by an outage. The rows used up are
  read as the operator reads them (``sluice billing reset-attempts --dry-run``): the
  attempts are Sluice's, and what this judges is what the operator is shown;
- ``refused_for_good``: an event Polar refused for good (a 422 naming it: the world's
  ``polar_refuses``) is not sent again, but after a crash in a metering-flush run left its
  outcome unknown (the run that sent it died before it was marked), judged from Polar's
  record of the requests carrying it; and within ``OWED_AFTER`` of the refusal (Polar and
  the stores up) it shows where docs/billing.md's runbook says an operator finds it: among
  the rows ``sluice billing reset-attempts --dry-run`` keeps, Polar's refusals, not the
  outage's. The calls behind it are metered all the same (``metered_once``: a refusal that
  held the rows behind it would leave them unsent);
- ``dead_letter_named``: no call ``record_usage`` makes is malformed, but with ``--limits``
  a foreign producer pushes a malformed envelope (judged apart from ``no_attempt_burned``):
  once ledger-redrive took it, it is on the ledger DLQ as the operations view lists it, its
  reason naming it malformed, until its user's erasure sweeps it.
- ``metering_paced``: within one metering-flush run Polar is asked at most
  ``TRANSIENT_IN_A_ROW`` times in a row while it answers 5xx, times out or refuses the
  connection, and never again after a 429 (docs/billing.md: "a 429 or a Retry-After ends
  the run; three in a row end it"), judged from Polar's own record of the run's requests:
  a flush that goes on into an outage spends every row's attempts on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from bench.simulate.peers import Window
from bench.simulate.world import UsageCall

if TYPE_CHECKING:
    from bench.simulate.invariants import Judge

OWED_AFTER = timedelta(hours=1)
RETRY_AFTER = timedelta(minutes=5)
OUTBOX_SUFFIX = ":metering"
TRANSIENT_IN_A_ROW = 3  # docs/billing.md: three transient answers in a row end a run
TRANSIENT = ("down", "error", "late")  # Polar's answers that are an outage's


def owed_at(since: datetime, windows: list[Window], end: datetime,
            length: timedelta = OWED_AFTER) -> datetime | None:
    """The end of the first ``length`` from ``since`` on clear of every window (None past
    ``end``)."""
    start = since
    moved = True
    while moved:
        moved = False
        for window in windows:
            if window.start < start + length and start < window.end:
                start, moved = window.end, True
    due = start + length
    return due if due <= end else None


class Billing:
    def __init__(self, judge: Judge, services: Any, redis: Any,
                 log: Callable[[str], None]) -> None:
        self.judge = judge
        self.services = services
        self.redis = redis  # the client without the injected outages (the harness's reads)
        self.log = log
        self.accepted: dict[str, datetime] = {}  # outbox id -> when its call was accepted
        self.calls: dict[str, UsageCall] = {}  # outbox id -> the call
        self.user_of: dict[str, str] = {}  # outbox id -> the call's user
        self.erased: Callable[[str], bool] = lambda user: False  # the user was erased
        self.burned = 0
        self.queued = False  # the last call reported went to the Redis retry queue
        self.answers: list[str] | None = None  # Polar's, to the metering-flush run under way
        self.refuses: set[str] = set()  # the outbox ids of the events Polar refuses for good
        self.refused: dict[str, int] = {}  # outbox id -> crashes seen at its first refusal
        self.refusals: dict[str, int] = {}  # outbox id -> requests Polar refused it in
        self.crashes = 0  # crashes at a metering point
        self.malformed: dict[str, str] = {}  # a foreign producer's malformed entry -> its user

    def polar_request(self, answer: str) -> None:
        """Polar was asked (``answer``: its behaviour then, ``up`` when it took the events)."""
        if self.answers is not None:
            self.answers.append(answer)

    def polar_refused(self, external_id: str, at: datetime) -> bool:
        """Polar refused a request for ``external_id`` (its own record); True the first time.
        ``refused_for_good``: sent again only after a crash left the outcome unknown."""
        self.refusals[external_id] = self.refusals.get(external_id, 0) + 1
        first = external_id not in self.refused
        crashes_before = self.refused.setdefault(external_id, self.crashes)
        allowed = 1 + self.crashes - crashes_before
        if self.refusals[external_id] > allowed:
            self.judge.fail("refused_for_good", at,
                            f"Polar was sent {external_id} {self.refusals[external_id]} times, "
                            f"although it refused it for good (a 422) the first time; "
                            f"{allowed - 1} crash(es) of metering-flush since could have "
                            "left its outcome unknown")
        return first

    def refusal_shown(self, external_id: str, at: datetime) -> None:
        """``refused_for_good``: the row Polar refused shows among those the operator's
        ``reset-attempts --dry-run`` keeps (Polar's refusals), as the runbook says."""
        from sluice.billing.reset import reset_attempts

        if self.erased(self.user_of.get(external_id, "")):
            return  # purged with its user
        listed = reset_attempts(self.services.db, actor="sim-operator", dry_run=True)
        if external_id not in listed.kept:
            where = "among the outage's (reset by default)" if external_id in listed.reset \
                else "nowhere: not failed for good"
            self.judge.fail("refused_for_good", at,
                            f"{external_id}, refused by Polar for good, shows {where} in "
                            "`sluice billing reset-attempts --dry-run` an hour on")

    def flush_started(self) -> None:
        self.answers = []

    def flush_ended(self, at: datetime) -> None:
        """``metering_paced`` over the requests the run just made."""
        answers, self.answers = self.answers or [], None
        streak = 0
        for n, answer in enumerate(answers):
            if answer == "ratelimit" and n + 1 < len(answers):
                self.judge.fail("metering_paced", at,
                                f"metering-flush asked Polar {len(answers) - n - 1} more "
                                "time(s) in the run after a 429")
                return
            streak = streak + 1 if answer in TRANSIENT else 0
            if streak > TRANSIENT_IN_A_ROW:
                self.judge.fail("metering_paced", at,
                                f"metering-flush asked Polar {streak} times in a row while "
                                f"it answered {answer} (a run ends after "
                                f"{TRANSIENT_IN_A_ROW})")
                return

    def report(self, call: UsageCall) -> bool:
        """The call reported with ``record_usage``; False when it was refused (retry)."""
        from sluice.billing.usage import UsageEntry, record_usage
        from sluice.core.errors import TransientStoreError
        from sluice.store.db import utcnow

        entry = UsageEntry(id=call.entry_id, model="sim-model", occurred_at=call.at,
                           tenant_id=call.tenant_id, user_id=call.user_id,
                           input_tokens=call.tokens, output_tokens=call.tokens // 3)
        self.queued = False
        try:
            recorded = record_usage(entry, db=self.services.db, redis=self.services.redis)
        except TransientStoreError:
            self.log(f"usage {call.entry_id}: refused (store and Redis down); reported again "
                     "later")
            return False
        self.log(f"usage {call.entry_id}: {recorded}")
        self.queued = recorded == "queued"  # on the Redis retry queue: ledger-redrive's work
        if recorded != "erased":  # an erased user's call is dropped: nothing is owed
            self.accepted[call.entry_id + OUTBOX_SUFFIX] = utcnow()
            self.calls[call.entry_id + OUTBOX_SUFFIX] = call
            self.user_of[call.entry_id + OUTBOX_SUFFIX] = call.user_id
        return True

    def polar_received(self, event: dict[str, Any], at: datetime) -> None:
        external_id = str(event.get("external_id"))
        if external_id not in self.accepted:
            self.judge.fail("metered_once", at,
                            f"Polar received {external_id}, the row of no accepted call")
            return
        call = self.calls[external_id]
        output = call.tokens // 3
        metadata = event.get("metadata") or {}
        wanted = {"name": ("ai_usage", event.get("name")),
                  "external_customer_id": (call.tenant_id, event.get("external_customer_id")),
                  "input_tokens": (call.tokens, metadata.get("input_tokens")),
                  "output_tokens": (output, metadata.get("output_tokens")),
                  "total_tokens": (call.tokens + output, metadata.get("total_tokens"))}
        wrong = [f"{name} {got!r} (the call's: {want!r})"
                 for name, (want, got) in wanted.items() if got != want]
        try:
            moment = datetime.fromisoformat(str(event.get("timestamp")))
            late = abs((moment - call.at).total_seconds()) >= 0.001
        except (ValueError, TypeError):  # not a time, or one without its zone
            late = True
        if late:
            wrong.append(f"timestamp {event.get('timestamp')!r} (the call's: "
                         f"{call.at.isoformat()})")
        if wrong:
            self.judge.fail("metered_right", at, f"Polar's event {external_id}: "
                            + "; ".join(wrong))

    def owed(self, external_id: str, polar_ids: Any, at: datetime) -> None:
        ledger_id = external_id.removesuffix(OUTBOX_SUFFIX)
        if self.erased(self.user_of[external_id]):
            return  # purged with its user (or dropped at redrive): erasure's invariants judge
        since = f"accepted {self.accepted[external_id]:%Y-%m-%d %H:%M}"
        if not polar_ids.get(external_id) and external_id not in self.refuses:
            self.judge.fail("metered_once", at, f"{external_id} ({since}) has not reached "
                            "Polar although Polar and the stores were up")
        with self.services.db.transaction() as tx:
            row = tx.fetchone("SELECT count(*) AS n FROM ai_usage_ledger WHERE id = :id",
                              {"id": ledger_id})
        count = int(row["n"]) if row else 0
        if count != 1:
            self.judge.fail("ledger_once", at, f"ledger entry {ledger_id} ({since}) is there "
                            f"{count} times")

    def foreign(self, at: datetime, user: str, tenant: str) -> None:
        """A foreign producer pushes a malformed retry envelope of ``user``'s call (its
        input tokens negative) onto the ledger's retry queue, as the contract's other
        writer could."""
        from sluice.store.redis_clients import LEDGER_RETRY_QUEUE

        entry_id = f"foreign-malformed-{len(self.malformed)}"
        stamp = at.isoformat().replace("+00:00", "Z")
        envelope = {"id": entry_id, "attempts": 0, "enqueuedAt": stamp, "lastError": None,
                    "entry": {"id": entry_id, "tenantId": tenant, "userId": user,
                              "model": "sim-model", "inputTokens": -5, "outputTokens": 0,
                              "costMicros": 0, "occurredAt": stamp}}
        self.redis.lpush(LEDGER_RETRY_QUEUE, json.dumps(envelope, separators=(",", ":")))
        self.malformed[entry_id] = user
        self.log(f"a foreign producer pushed {entry_id} (malformed) for {user}")

    def _malformed_kept(self, at: datetime, letters: dict[str, Any]) -> None:
        """``dead_letter_named``: a malformed entry the world pushed, once ledger-redrive
        took it off the queue, is on the ledger's DLQ as the operations view lists it,
        its reason naming it malformed (docs/billing.md), until its user's erasure sweeps
        it."""
        from sluice.store.redis_clients import LEDGER_RETRY_PROCESSING, LEDGER_RETRY_QUEUE

        waiting = " ".join(self.redis.lrange(LEDGER_RETRY_QUEUE, 0, -1)
                           + self.redis.lrange(LEDGER_RETRY_PROCESSING, 0, -1))
        for entry_id, user in list(self.malformed.items()):
            letter = letters.get(entry_id)
            if letter is not None:
                if not str(letter.reason).startswith("malformed"):
                    self.judge.fail("dead_letter_named", at,
                                    f"{entry_id}, malformed, is on the ledger DLQ with the "
                                    f"reason {letter.reason!r}, not naming it malformed")
                del self.malformed[entry_id]
            elif entry_id not in waiting and not self.erased(user):
                self.judge.fail("dead_letter_named", at,
                                f"{entry_id}, malformed, left the retry queue and is not on "
                                "the ledger DLQ")
                del self.malformed[entry_id]

    def check_attempts(self, at: datetime) -> None:
        """After a metering-flush or ledger-redrive run: nothing burned but what Polar
        refused (its own record) and the malformed envelopes a foreign producer pushed."""
        from sluice.billing.deadletters import LedgerDeadLetters
        from sluice.billing.reset import reset_attempts

        listed = reset_attempts(self.services.db, actor="sim-operator", dry_run=True)
        used_up = [row for row in [*listed.reset, *listed.kept] if row not in self.refused]
        letters = {letter.id: letter for letter in LedgerDeadLetters(self.services).list(500)}
        self._malformed_kept(at, letters)
        burned = len(used_up) + sum(1 for entry_id in letters
                                    if not entry_id.startswith("foreign-malformed-"))
        if burned > self.burned:
            self.judge.fail("no_attempt_burned", at,
                            f"{burned} outbox rows used up or ledger entries dead-lettered "
                            f"(Polar refused none of them: an outage burned them; "
                            f"{', '.join(sorted(used_up)[:3])})")
        self.burned = burned
