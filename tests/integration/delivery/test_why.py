""""Why is this waiting?" against what the drain then does.

Every row of the policy (``SCENARIOS`` of test_policy_table.py brings an entry there
through the real drain and store) and every kind of hold (``HOLDS`` below) on SQLite and
Postgres: ask ``why``, check its kind is the row's (the policy's next due, or its status),
then run the drain job and check it does what the sentence says. Held until a time: not
sent before it (the clock is moved to just before it first: a run may wait for a rate slot
within its budget, but never sends early), and sent once it has passed (the clock moved
past it: every time Sluice stored, the entry's, its keys' and the rates', moved back
alike). Due: sent by the run. Failed by the next drain (disabled, expired): failed so,
nothing sent. At rest (sent, failed, unknown): the run leaves it as it is."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from sluice.core.errors import NotFound
from sluice.core.services import Services
from sluice.core.times import iso_z
from sluice.delivery.drain import Deliverer
from sluice.delivery.policy import TABLE, DeliveryOutcome, Due
from sluice.delivery.store import DeliveryEntry
from sluice.delivery.why import HOLD_OF_DUE, HOLD_OF_STATUS, Hold, Why, why
from sluice.jobs.registry import Deadline
from sluice.store.db import utcnow
from tests.integration.delivery.helpers import Providers, drain_once
from tests.integration.delivery.test_policy_table import LEASE, SCENARIOS, World, hook
from tests.providers.http import ProviderServer, json_response

TIMED = (Hold.SCHEDULE, Hold.PROBE, Hold.SLOT, Hold.PROVIDER, Hold.PAUSED, Hold.IN_FLIGHT)
AT_REST = (Hold.SENT, Hold.FAILED, Hold.UNKNOWN)
SECOND = timedelta(seconds=1)
_QUEUE_TIMES = ("next_attempt_at", "lease_until", "enqueued_at", "updated_at", "acked_at",
                "failed_at", "request_left_at", "started_at", "restarted_at")
_KEY_TIMES = ("down_since", "next_probe_at", "updated_at", "paused_until", "paused_at",
              "disabled_at", "rate_until", "last_success_at", "ready_at")


def expected(outcome: DeliveryOutcome) -> Hold | None:
    """The kind of hold a row leaves its entry in (None: the entry is gone)."""
    row = TABLE[outcome]
    if row.status == "deleted":
        return None
    if row.status == "pending":
        return HOLD_OF_DUE[row.due]
    return HOLD_OF_STATUS[row.status]


# --- the holds no row of the policy leaves an entry in at rest ------------------------------


class Hold_(NamedTuple):
    kind: Hold
    make: Callable[[World], DeliveryEntry]


def _in_flight(w: World) -> DeliveryEntry:
    entry = hook(w)
    [claimed] = w.store.claim(LEASE)  # a sender holds it, its request not left yet
    assert claimed.id == entry.id
    return claimed


def _disabled_since(w: World) -> DeliveryEntry:
    w.operator("disable", w.hook_key, reason="the receiver is being replaced")
    return hook(w)  # enqueued after the disable: the next drain fails it


def _redriven_after_disable(w: World) -> DeliveryEntry:
    entry = _disabled_since(w)
    drain_once(w.svc)
    assert w.store.get(entry.id).failure_reason == "destination_disabled"
    return w.store.redrive(entry.id)  # restarted after the disable: it goes once, as asked


def _expired_unsent(w: World) -> DeliveryEntry:
    return w.store.enqueue("webhook", w.providers.webhook.url, {"text": "old"},
                           now=utcnow() - timedelta(days=2))[0]


def _paused_past_expiry(w: World) -> DeliveryEntry:
    entry = _expired_unsent(w)
    w.operator("pause", w.hook_key, until=iso_z(utcnow() + timedelta(hours=1)))
    return entry  # nothing expires while paused: its expiry restarts at the pause's end


HOLDS: dict[str, Hold_] = {
    "in flight": Hold_(Hold.IN_FLIGHT, _in_flight),
    "disabled since its enqueue": Hold_(Hold.DISABLED, _disabled_since),
    "redriven after the disable": Hold_(Hold.DUE, _redriven_after_disable),
    "past its expiry": Hold_(Hold.EXPIRED, _expired_unsent),
    "paused past its expiry": Hold_(Hold.PAUSED, _paused_past_expiry),
}


DOC = Path(__file__).parents[3] / "docs" / "delivery.md"
HEADER = "| kind | what holds it | until | the policy's next due | the next drain |"


def test_the_docs_table_is_the_kinds_and_the_policys_due() -> None:
    """docs/delivery.md's "Why is this waiting?" table: one row a kind, in ``Hold``'s order,
    each pending kind beside the next due the policy names it by (``HOLD_OF_DUE``), what
    fails or rests beside ``never``."""
    lines = DOC.read_text().splitlines()
    rows = []
    for line in lines[lines.index(HEADER) + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows.append((cells[0], cells[3]))
    due_of = {hold: due.value for due, hold in HOLD_OF_DUE.items()}
    never = {Hold.DISABLED, Hold.EXPIRED, *HOLD_OF_STATUS.values()} - {Hold.IN_FLIGHT}
    assert rows == [(hold.value, due_of.get(hold, "never" if hold in never else "—"))
                    for hold in Hold]
    assert TABLE[DeliveryOutcome.DISABLE].due is TABLE[DeliveryOutcome.EXPIRED].due is Due.NEVER


def test_every_kind_of_hold_is_walked() -> None:
    kinds = {expected(outcome) for outcome in SCENARIOS} | {h.kind for h in HOLDS.values()}
    assert kinds - {None} == set(Hold)


# --- the clock, the receivers ----------------------------------------------------------------


def _time(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value).astimezone(UTC)


def advance(w: World, by: timedelta) -> None:
    """Time travel by ``by``: every time Sluice stored of the queue, its keys and the rates
    moves back by it (the same as the clock moving on)."""
    with w.svc.db.transaction() as tx:
        for table, key, columns in (("delivery_queue", "id", _QUEUE_TIMES),
                                    ("delivery_destinations", "key", _KEY_TIMES)):
            for row in tx.fetchall(f"SELECT {key}, {', '.join(columns)} FROM {table}"):
                moved = {c: _time(row[c]) - by for c in columns if row[c] is not None}
                if moved:
                    sets = ", ".join(f"{c} = :{c}" for c in moved)
                    tx.execute(f"UPDATE {table} SET {sets} WHERE {key} = :k",
                               {**moved, "k": row[key]})
        tx.execute("UPDATE delivery_rate_limits SET next_at_us = next_at_us - :us",
                   {"us": int(by.total_seconds() * 1_000_000)})


def heal(w: World, stack: ExitStack, providers: Providers) -> None:
    """Every receiver answers again: scripted failures spent, nobody late, and a receiver
    on the port nobody listened on."""
    providers.webhook.answers.clear()
    providers.telegram.flood_wait.clear()
    providers.telegram.late_s = 0.0
    stack.enter_context(ProviderServer(lambda *request: json_response(200, {"ok": True}),
                                       port=w.dead_port))


class Acks:
    """The adapter of the out-of-memory row's next run: it takes every message."""

    name = "webhook"

    def outage_key(self, entry: DeliveryEntry) -> str:
        return "webhook"

    def send(self, entry: DeliveryEntry, progress: Any = None) -> str:
        return f"m-{entry.id}"


# --- the walk ---------------------------------------------------------------------------------


def _drain(w: World, entry: DeliveryEntry, services: Services) -> None:
    if entry.recipient.startswith("http://127.0.0.1:9/"):  # the out-of-memory row's entry
        Deliverer(w.store, {"webhook": Acks()},  # type: ignore[dict-item]
                  lease=LEASE, send_timeout_s=1).drain(Deadline(30))
    else:
        drain_once(services)


def follow(w: World, answer: Why, services: Services | None = None) -> None:
    """Run the drain and check it does what ``answer`` said."""
    services = services or w.svc
    before = w.store.get(answer.id)
    if answer.kind in TIMED and answer.until is not None:
        # just before the hold ends: the run sends nothing before its time
        ahead = answer.until - utcnow() - 2 * SECOND
        if ahead > timedelta(0):
            advance(w, ahead)
            again = why(services, answer.id)
            assert again.kind is answer.kind, (again, answer)
            answer, before = again, w.store.get(answer.id)
        _drain(w, before, services)
        after = w.store.get(answer.id)
        if after.status.value == "acked":  # it waited for the slot within its budget
            assert after.request_left_at is not None
            assert after.request_left_at >= answer.until, (answer, after)
            return
        assert after == before, f"claimed while held: {answer.sentence}"
        # ... and once it has passed, the run sends it
        by = answer.until - utcnow() + SECOND
        advance(w, by)
        _drain(w, after, services)
        sent = w.store.get(answer.id)
        assert sent.status.value == "acked", (answer.sentence, sent.last_error)
        assert sent.request_left_at is not None and sent.request_left_at >= answer.until - by
        return
    _drain(w, before, services)
    after = w.store.get(answer.id)
    if answer.kind is Hold.DUE:
        assert after.status.value == "acked", (answer.sentence, after.last_error)
    elif answer.kind in (Hold.DISABLED, Hold.EXPIRED):
        reason = "destination_disabled" if answer.kind is Hold.DISABLED else "expired"
        assert (after.status.value, after.failure_reason) == ("failed", reason)
        assert after.request_left_at is None, "nothing sent"
    else:  # at rest, or waiting for what no time ends (its channel's credential)
        assert answer.kind in (*AT_REST, Hold.UNCONFIGURED)
        assert after == before, f"the run changed it: {answer.sentence}"


@pytest.fixture
def world(svc: Services, providers: Providers, make_services: Callable[..., Services],
          db_url: str) -> Iterator[tuple[World, ExitStack]]:
    with ExitStack() as stack:
        yield World(svc, providers, make_services, db_url), stack


def _ask(w: World, entry_id: str, services: Services | None = None) -> Why:
    answer = why(services or w.svc, entry_id)
    assert answer.sentence and answer.sentence[0].isupper() and answer.sentence.endswith(".")
    assert "\n" not in answer.sentence
    return answer


@pytest.mark.parametrize("outcome", list(DeliveryOutcome),
                         ids=lambda o: re.sub(r"\W+", "-", o.value))
def test_why_says_what_the_drain_then_does_for_every_row(
        outcome: DeliveryOutcome, world: tuple[World, ExitStack]) -> None:
    w, stack = world
    walked = SCENARIOS[outcome](w)
    kind = expected(outcome)
    if kind is None:  # purged: there is nothing to hold
        with pytest.raises(NotFound):
            why(w.svc, walked.entry.id if walked.entry else "gone")
        return
    assert walked.entry is not None
    entry_id = walked.entry.id
    heal(w, stack, w.providers)
    if TABLE[outcome].due is Due.CONFIGURED:
        # without the channel's credential it waits, and the run leaves it ...
        unconfigured = w.services(drop="TELEGRAM")
        answer = _ask(w, entry_id, unconfigured)
        assert answer.kind is Hold.UNCONFIGURED and answer.until is None, answer
        follow(w, answer, unconfigured)
        # ... and once configured, nothing holds it
        kind = Hold.DUE
    answer = _ask(w, entry_id)
    assert answer.kind is kind, answer
    if kind in TIMED:
        assert answer.until is not None and answer.until > utcnow(), answer
    if kind in (Hold.PROBE, Hold.SLOT, Hold.PROVIDER):
        assert answer.key == walked.entry.receiver
    follow(w, answer)


@pytest.mark.parametrize("name", list(HOLDS))
def test_why_says_what_the_drain_then_does_for_every_hold(
        name: str, world: tuple[World, ExitStack]) -> None:
    w, stack = world
    hold = HOLDS[name]
    entry = hold.make(w)
    heal(w, stack, w.providers)
    answer = _ask(w, entry.id)
    assert answer.kind is hold.kind, answer
    if hold.kind in (Hold.PAUSED, Hold.DISABLED):
        assert answer.key == w.hook_key
    follow(w, answer)
