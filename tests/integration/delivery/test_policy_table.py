"""The delivery policy's table: docs/delivery.md shows exactly ``TABLE``, and every row
holds against the code. Each row has a scenario that brings an entry to that outcome
through the real drain and store (real stand-ins, a real unreachable Redis, SQLite and
Postgres), and the stored entry is judged from the row alone: its status, its attempts,
when it is next due and who may send it again."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from pathlib import Path

import pytest

from sluice.core.services import Services
from sluice.core.times import iso_z
from sluice.delivery.channels import Outbound
from sluice.delivery.drain import Deliverer
from sluice.delivery.policy import (
    TABLE,
    Attempt,
    DeliveryDecision,
    DeliveryOutcome,
    Due,
    FailureReason,
    Sender,
)
from sluice.delivery.replay import Replay, ReplayFilter
from sluice.delivery.store import DeliveryEntry, DeliveryStore
from sluice.jobs.registry import Deadline
from sluice.ops.destinations import apply, parse_change
from sluice.store.db import utcnow
from tests.conftest import free_port
from tests.integration.delivery.helpers import Providers, drain_once, due_now
from tests.integration.delivery.test_delivery_outages import OutOfMemory

DOC = Path(__file__).parents[3] / "docs" / "delivery.md"
HEADER = "| outcome | when | attempt | status | next due | sent again by |"
LEASE = timedelta(minutes=2)
STEPS_S = (5, 25, 120, 600)  # the schedule, as the docs state it


def doc_rows() -> list[tuple[str, ...]]:
    lines = DOC.read_text().splitlines()
    start = lines.index(HEADER) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows.append((cells[0], *cells[2:]))
    return rows


def row_of(decision: DeliveryDecision) -> tuple[str, ...]:
    status = decision.status + (f" ({decision.reason.value})" if decision.reason else "")
    return (decision.outcome.value, decision.attempt.value, status, decision.due.value,
            decision.sender.value)


def test_the_docs_table_is_the_policy() -> None:
    assert doc_rows() == [row_of(decision) for decision in TABLE.values()]


@dataclass
class World:
    svc: Services
    providers: Providers
    make: Callable[..., Services]
    db_url: str

    @property
    def store(self) -> DeliveryStore:
        return DeliveryStore(self.svc.db)

    def services(self, drop: str = "", **extra: str) -> Services:
        env = {k: v for k, v in self.providers.env().items() if not drop or drop not in k}
        return self.make(self.db_url, **{**env, **extra})

    def set(self, entry: DeliveryEntry, **columns: object) -> None:
        assignments = ", ".join(f"{name} = :{name}" for name in columns)
        with self.svc.db.transaction() as tx:
            tx.execute(f"UPDATE delivery_queue SET {assignments} WHERE id = :id",
                       {**columns, "id": entry.id})

    def set_destination(self, key: str, **columns: object) -> None:
        assignments = ", ".join(f"{name} = :{name}" for name in columns)
        with self.svc.db.transaction() as tx:
            tx.execute(f"UPDATE delivery_destinations SET {assignments} WHERE key = :key",
                       {**columns, "key": key})

    def operator(self, action: str, key: str, **body: object) -> None:
        """An operator's change of a destination, as the API and the command line make it."""
        apply(self.svc, parse_change(action, key, dict(body)))

    @property
    def hook_key(self) -> str:
        return f"webhook:127.0.0.1:{self.providers.webhook.url.split(':')[2].split('/')[0]}"

    @cached_property
    def dead_port(self) -> int:
        return free_port()

    @property
    def dead_url(self) -> str:
        return f"http://127.0.0.1:{self.dead_port}"

    @property
    def dead_key(self) -> str:
        return f"webhook:127.0.0.1:{self.dead_port}"


@dataclass
class Walked:
    before: int  # the entry's attempts before the claim (or the operator's action)
    entry: DeliveryEntry | None  # as stored after the outcome (None: deleted)
    started: datetime
    ended: datetime
    key: str | None = None  # what holds it, when its row says a probe sends it again
    wait_s: float = 0.0  # the wait its row names (a slot, the provider's answer)


Scenario = Callable[[World], Walked]
SCENARIOS: dict[DeliveryOutcome, Scenario] = {}


def scenario(outcome: DeliveryOutcome) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        SCENARIOS[outcome] = fn
        return fn
    return register


def drained(w: World, entry: DeliveryEntry, services: Services | None = None,
            before: int = 0, **walked: object) -> Walked:
    started = utcnow()
    drain_once(services or w.svc)
    return Walked(before, w.store.get(entry.id), started, utcnow(), **walked)  # type: ignore[arg-type]


def hook(w: World, text: str = "x") -> DeliveryEntry:
    return w.store.enqueue("webhook", w.providers.webhook.url, {"text": text})[0]


def chat(w: World, recipient: str = "1001") -> DeliveryEntry:
    return w.store.enqueue("telegram", recipient, {"text": "x"})[0]


@scenario(DeliveryOutcome.ACKED)
def _acked(w: World) -> Walked:
    return drained(w, hook(w))


@scenario(DeliveryOutcome.PERMANENT)
def _permanent(w: World) -> Walked:
    w.providers.webhook.answers.append(422)  # refused for good: the message, not the host
    return drained(w, hook(w))


@scenario(DeliveryOutcome.TRANSIENT)
def _transient(w: World) -> Walked:
    w.providers.webhook.answers.extend([200, 503, 503, 503])  # the host took the first
    hook(w, "a")
    return drained(w, hook(w, "b"))


@scenario(DeliveryOutcome.LAST_ATTEMPT)
def _last_attempt(w: World) -> Walked:
    w.providers.webhook.answers.extend([200, 503, 503, 503])
    hook(w, "a")
    second = hook(w, "b")
    w.set(second, attempts=4)
    return drained(w, second, before=4)


def dead(w: World, path: str = "a") -> DeliveryEntry:
    """An entry for a receiver nobody listens on: refused, never reached."""
    return w.store.enqueue("webhook", f"{w.dead_url}/{path}", {"text": path})[0]


@scenario(DeliveryOutcome.DESTINATION_FAILING)
def _destination_failing(w: World) -> Walked:
    return drained(w, dead(w), key=w.dead_key)


@scenario(DeliveryOutcome.DESTINATION_HELD)
def _destination_held(w: World) -> Walked:
    dead(w, "probe")
    # another URL on the same receiver, claimed in the same turn: set aside unsent
    return drained(w, dead(w, "other"), key=w.dead_key)


@scenario(DeliveryOutcome.DESTINATION_GONE)
def _destination_gone(w: World) -> Walked:
    w.providers.webhook.answers.append(410)
    return drained(w, hook(w))


@scenario(DeliveryOutcome.DESTINATION_STALE)
def _destination_stale(w: World) -> Walked:
    entry = dead(w)
    drain_once(w.svc)  # failing from now...
    w.set_destination(w.dead_key, down_since=utcnow() - timedelta(days=5, minutes=1))
    due_now(w.svc)  # ... and five days on, its probe fails again
    return drained(w, entry, key=w.dead_key)


def _acting_mid_run(w: World, action: str, **body: object) -> Walked:
    """Two entries claimed in one turn; the operator acts while the first is being
    answered: the second, claimed already, is stopped before its request leaves."""
    hook(w, "first")
    second = hook(w, "second")

    def operator(path: str, key: str) -> None:
        w.providers.webhook.on_request = None
        w.operator(action, w.hook_key, **body)

    w.providers.webhook.on_request = operator
    return drained(w, second, key=w.hook_key)


@scenario(DeliveryOutcome.DESTINATION_DISABLED)
def _destination_disabled(w: World) -> Walked:
    return _acting_mid_run(w, "disable", reason="the receiver is being replaced")


@scenario(DeliveryOutcome.DESTINATION_PAUSED)
def _destination_paused(w: World) -> Walked:
    return _acting_mid_run(w, "pause", until=iso_z(utcnow() + timedelta(hours=1)))


def _seen_pending(w: World) -> DeliveryEntry:
    """A pending entry the drain has taken (its destination written on it): the host took
    the first entry, then failed this one transiently (attempt 1 counted)."""
    w.providers.webhook.answers.extend([200, 503, 503, 503])
    hook(w, "a")
    entry = hook(w, "b")
    drain_once(w.svc)
    seen = w.store.get(entry.id)
    assert (seen.status.value, seen.receiver) == ("pending", w.hook_key)
    return seen


def _changed(w: World, entry: DeliveryEntry, action: str, **body: object) -> Walked:
    started = utcnow()
    w.operator(action, w.hook_key, **body)
    return Walked(entry.attempts, w.store.get(entry.id), started, utcnow(), key=w.hook_key)


@scenario(DeliveryOutcome.PAUSE)
def _pause(w: World) -> Walked:
    return _changed(w, _seen_pending(w), "pause",
                    until=iso_z(utcnow() + timedelta(hours=2)))


@scenario(DeliveryOutcome.RESUME)
def _resume(w: World) -> Walked:
    entry = _seen_pending(w)
    w.operator("pause", w.hook_key, until=iso_z(utcnow() + timedelta(hours=2)))
    return _changed(w, w.store.get(entry.id), "resume")


@scenario(DeliveryOutcome.DISABLE)
def _disable(w: World) -> Walked:
    return _changed(w, _seen_pending(w), "disable")


@scenario(DeliveryOutcome.NO_SLOT)
def _no_slot(w: World) -> Walked:
    # 100 s spacing (5 % headroom: 105 s), past the run's budget: the run does not wait
    # for the slot (a shorter one it would wait for, with nothing else to send)
    slow = w.services(SLUICE_WEBHOOK_HOST_RATE_PER_SECOND="0.01",
                      SLUICE_DELIVERY_RATE_WAIT_SECONDS="0")
    hook(w, "takes the slot")
    return drained(w, hook(w, "waits"), slow, wait_s=100.0)


@scenario(DeliveryOutcome.PACING)
def _pacing(w: World) -> Walked:
    w.providers.telegram.flood_wait.extend([40, 40, 40])
    return drained(w, chat(w), wait_s=40.0)


@scenario(DeliveryOutcome.PACING_PAST_CAP)
def _pacing_past_cap(w: World) -> Walked:
    w.providers.telegram.flood_wait.extend([7200])
    return drained(w, chat(w), key="telegram:1001")


def _late(w: World) -> Services:
    w.providers.telegram.late_s = 0.8
    return w.services(SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS="0.3")


@scenario(DeliveryOutcome.UNKNOWN)
def _unknown(w: World) -> Walked:
    return drained(w, chat(w), _late(w))


@scenario(DeliveryOutcome.UNKNOWN_RESTS)
def _unknown_rests(w: World) -> Walked:
    entry = chat(w)
    w.set(entry, unknown_sends=1)  # its one resend is used
    return drained(w, entry, _late(w))


@scenario(DeliveryOutcome.NOT_SENT)
def _not_sent(w: World) -> Walked:
    down = w.services(SLUICE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")  # nobody there
    return drained(w, chat(w), down)


@scenario(DeliveryOutcome.NO_ADAPTER)
def _no_adapter(w: World) -> Walked:
    return drained(w, chat(w), w.services(drop="TELEGRAM"))


def _lapse(w: World, entry: DeliveryEntry, *, request_left: bool) -> Walked:
    then = utcnow() - LEASE - timedelta(minutes=1)
    w.set(entry, next_attempt_at=then)
    [claimed] = w.store.claim(LEASE, now=then)
    if request_left:
        assert w.store.request_left(claimed, now=then)
    started = utcnow()
    w.store.recover()  # what the drain does first
    return Walked(0, w.store.get(entry.id), started, utcnow())


@scenario(DeliveryOutcome.LAPSED_SENT)
def _lapsed_sent(w: World) -> Walked:
    return _lapse(w, chat(w), request_left=True)


@scenario(DeliveryOutcome.LAPSED_SENT_RESTS)
def _lapsed_sent_rests(w: World) -> Walked:
    entry = chat(w)
    w.set(entry, unknown_sends=1)
    return _lapse(w, entry, request_left=True)


@scenario(DeliveryOutcome.LAPSED_UNSENT)
def _lapsed_unsent(w: World) -> Walked:
    return _lapse(w, chat(w), request_left=False)


@scenario(DeliveryOutcome.LAPSED_UNSENT_LIMIT)
def _lapsed_unsent_limit(w: World) -> Walked:
    entry = chat(w)
    w.set(entry, unsent_lapses=4)  # its senders died before sending it four times already
    return _lapse(w, entry, request_left=False)


@scenario(DeliveryOutcome.FATAL)
def _fatal(w: World) -> Walked:
    entry = w.store.enqueue("webhook", "http://127.0.0.1:9/a", {"text": "a"})[0]
    started = utcnow()
    Deliverer(w.store, {"webhook": OutOfMemory()}, lease=LEASE, send_timeout_s=1).drain(
        Deadline(30))
    return Walked(0, w.store.get(entry.id), started, utcnow())


@scenario(DeliveryOutcome.EXPIRED)
def _expired(w: World) -> Walked:
    entry = w.store.enqueue("webhook", w.providers.webhook.url, {"text": "x"},
                            now=utcnow() - timedelta(days=2))[0]
    return drained(w, entry)


def _resting(w: World, *, failed: bool) -> DeliveryEntry:
    """An entry an operator may act on: failed for good, or resting unknown."""
    if failed:
        w.providers.webhook.answers.append(422)
    entry = hook(w) if failed else chat(w)
    if not failed:
        w.set(entry, status="unknown", attempts=2, unknown_sends=2,
              enqueued_at=utcnow() - timedelta(days=20))
    else:
        drain_once(w.svc)
    return w.store.get(entry.id)


def _operator(w: World, entry: DeliveryEntry, action: Callable[[str], object]) -> Walked:
    started = utcnow()
    action(entry.id)
    found = [e for e in w.store.list(limit=500) if e.id == entry.id]
    return Walked(entry.attempts, found[0] if found else None, started, utcnow())


@scenario(DeliveryOutcome.REDRIVE)
def _redrive(w: World) -> Walked:
    return _operator(w, _resting(w, failed=True), w.store.redrive)


@scenario(DeliveryOutcome.SEND_AGAIN)
def _send_again(w: World) -> Walked:
    return _operator(w, _resting(w, failed=False), w.store.send_again)


@scenario(DeliveryOutcome.REPLAY_ACKED)
def _replay_acked(w: World) -> Walked:
    entry = hook(w)
    drain_once(w.svc)
    flt = ReplayFilter(w.hook_key, utcnow() - timedelta(hours=1), utcnow(), "acked")

    def replay(entry_id: str) -> None:
        with Outbound.open(w.svc.settings) as client:
            assert Replay.from_services(w.svc, client).run(flt, dry_run=False).count == 1

    return _operator(w, w.store.get(entry.id), replay)


@scenario(DeliveryOutcome.MARK_DELIVERED)
def _mark_delivered(w: World) -> Walked:
    return _operator(w, _resting(w, failed=False), w.store.mark_delivered)


@scenario(DeliveryOutcome.PURGE)
def _purge(w: World) -> Walked:
    return _operator(w, _resting(w, failed=True), w.store.purge)


def test_every_row_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(DeliveryOutcome)


def _destination_at(w: World, key: str, column: str) -> datetime | None:
    with w.svc.db.transaction() as tx:
        row = tx.fetchone(f"SELECT {column} AS at FROM delivery_destinations WHERE key = :key",
                          {"key": key})
    if row is None or row["at"] is None:
        return None
    value = row["at"]
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def w_claim(w: World) -> set[str]:
    """The ids a claim would take now (taken, then given back untouched)."""
    with w.svc.db.transaction() as tx:
        tx.execute("SELECT 1")
    claimed = w.store.claim(LEASE, limit=100, per_round=100)
    with w.svc.db.transaction() as tx:
        for e in claimed:
            tx.execute("UPDATE delivery_queue SET status = 'pending', attempts = attempts - 1,"
                       " lease_until = NULL, next_attempt_at = :now WHERE id = :id",
                       {"id": e.id, "now": utcnow()})
    return {e.id for e in claimed}


def _probe_at(w: World, key: str) -> datetime | None:
    return _destination_at(w, key, "next_probe_at")


@pytest.mark.parametrize("outcome", list(DeliveryOutcome), ids=lambda o: re.sub(r"\W+", "-", o.value))
def test_every_row_of_the_policy_holds_against_the_code(
        outcome: DeliveryOutcome, svc: Services, providers: Providers,
        make_services: Callable[..., Services], db_url: str) -> None:
    world = World(svc, providers, make_services, db_url)
    walked = SCENARIOS[outcome](world)
    row = TABLE[outcome]
    entry, second = walked.entry, timedelta(seconds=1)

    if row.status == "deleted":
        assert entry is None
        return
    assert entry is not None
    assert (entry.status.value, entry.failure_reason) == (
        row.status, row.reason.value if row.reason else entry.failure_reason), entry.last_error
    expected_attempts = {Attempt.COUNTS: walked.before + 1, Attempt.GIVEN_BACK: walked.before,
                         Attempt.KEPT: walked.before, Attempt.RESET: 0}[row.attempt]
    assert entry.attempts == expected_attempts, entry.last_error

    due = entry.next_attempt_at
    if row.due is Due.NOW:
        assert due <= walked.ended + second
    elif row.due is Due.SCHEDULE:
        step = timedelta(seconds=STEPS_S[min(entry.attempts, len(STEPS_S)) - 1])
        assert walked.started + step - second <= due <= walked.ended + step + second
    elif row.due is Due.SLOT:  # its receiver is paced until the slot; the entry keeps its place
        wait = timedelta(seconds=walked.wait_s)
        ready = _destination_at(world, entry.receiver or "", "ready_at")
        assert ready is not None
        assert walked.started + wait - 2 * second <= ready <= walked.ended + wait + second
        assert due <= walked.ended and entry.id not in w_claim(world), "not before the slot"
    elif row.due is Due.PROVIDER:
        wait = timedelta(seconds=walked.wait_s)
        assert walked.started + wait - 2 * second <= due <= walked.ended + wait + second
    elif row.due is Due.PROBE:
        assert walked.key is not None and walked.key == entry.receiver
        probe = _probe_at(world, walked.key)
        assert probe is not None and probe > walked.ended, "held until its receiver's probe"
        assert due >= probe - second, "due with the probe: tried after those that waited"
    elif row.due is Due.CONFIGURED:
        assert entry.held_by == f"unconfigured:{entry.channel}"
    elif row.due is Due.PAUSE_END:
        assert walked.key is not None and walked.key in (entry.destination, entry.receiver)
        pause_end = _destination_at(world, walked.key, "paused_until")
        assert pause_end is not None and pause_end > walked.ended, "held until the pause ends"
        claimed = w_claim(world)
        assert entry.id not in claimed, "the claim does not take it while the pause lasts"
    if row.status != "pending":
        assert row.due is Due.NEVER

    if row.sender is Sender.DRAIN:
        assert entry.held_by in (None, f"unconfigured:{entry.channel}")
        assert entry.status.value == "pending"
    elif row.sender is Sender.PROBE:
        assert walked.key is not None and _probe_at(world, walked.key) is not None
    elif row.sender is Sender.OPERATOR:
        assert entry.status.value in ("failed", "unknown")
    else:
        assert entry.status.value == "acked"
    if row.outcome in (DeliveryOutcome.REDRIVE, DeliveryOutcome.SEND_AGAIN,
                       DeliveryOutcome.REPLAY_ACKED, DeliveryOutcome.RESUME):
        assert entry.started_at is not None and entry.started_at >= walked.started, \
            "the expiry reads the restart"
    if row.reason is FailureReason.DESTINATION_DISABLED:
        key = walked.key or entry.destination or ""
        assert key in (entry.destination, entry.receiver)
        assert _destination_at(world, key, "disabled_at") is not None, "it is disabled"
