"""The kill sweep: every crash point of every drain, at several positions, on each store.

One run: a fresh database (and Redis prefix), a known workload seeded, the drain run
in its own interpreter with ``SLUICE_CRASH_AT=point@N`` (it dies there with
``os._exit``), then run again until it has nothing left, and the store and the
provider stand-in compared with what was seeded. The push-queue consumer is driven the
same way, by an event source mapping in miniature over SQS on a moto server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from bench.chaos.consumer import ConsumerKill, ConsumerKillBatch
from bench.chaos.points import discover
from bench.chaos.stores import DEFAULT_REDIS_URL, REDIS_URL_ENV, ScratchStores, redis_prefix
from sluice.core.crash import CRASH_EXIT_CODE
from sluice.core.crash import ENV as CRASH_ENV

ROOT = Path(__file__).resolve().parents[2]
CRON_SECRET = "chaos-cron-secret-0123456789"
WEBHOOK_SECRET = "chaos-webhook-secret-0123456789"
POLAR_TOKEN = "chaos-polar-token"
MAX_COMPLETION_RUNS = 6
SUBPROCESS_TIMEOUT_S = 120
CLI = "sluice.cli.main"


@dataclass
class Counts:
    """What one run's check found (``effects``: duplicate effects, ``allowed`` of them the
    receiver deduplicates)."""

    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    stuck: int = 0
    burned: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass
class Tally:
    scenario: str
    runs: int = 0
    reached: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    stuck: int = 0
    burned: int = 0
    notes: list[str] = field(default_factory=list)
    points_reached: set[str] = field(default_factory=set)
    verb: str = "killed"  # what ``reached`` counts: runs killed, or runs that met the fault

    def add(self, counts: Counts) -> None:
        self.runs += 1
        self.lost += counts.lost
        self.duplicated += counts.duplicated
        self.unexpected += counts.unexpected
        self.stuck += counts.stuck
        self.burned += counts.burned
        self.notes.extend(counts.notes)

    @property
    def bad(self) -> bool:
        return bool(self.lost or self.stuck or self.unexpected or self.burned)


def _env(env: dict[str, str]) -> dict[str, str]:
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLUICE_", "CRON_", "POLAR_", "AWS_", "CHAOS_"))}
    full.update(env)
    return full


def sluice(args: list[str], env: dict[str, str], *, crash_at: str | None = None,
           module: str = CLI) -> subprocess.CompletedProcess[str]:
    """``sluice ARGS`` (or ``python -m MODULE ARGS``) in a fresh interpreter with only
    ``env`` as Sluice's settings."""
    full = _env(env)
    if crash_at:
        full[CRASH_ENV] = crash_at
    return subprocess.run([sys.executable, "-m", module, *args], env=full, cwd=ROOT,
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S,
                          check=False)


def _module(scenario: Any) -> str:
    return str(getattr(scenario, "module", CLI))


def _finish_args(scenario: Any) -> list[str]:
    return ["run", scenario.job, "--json"] if _module(scenario) == CLI else []


def run_to_completion(scenario: Any, url: str, env: dict[str, str], label: str) -> list[str]:
    """Run the scenario's drain (or consumer) until nothing is left, at most its run count;
    notes for every run that exited other than ok (0) or partial (2)."""
    notes: list[str] = []
    for _ in range(getattr(scenario, "max_runs", MAX_COMPLETION_RUNS)):
        scenario.between(url)
        done = sluice(_finish_args(scenario), env, module=_module(scenario))
        if done.returncode not in (0, 2):
            notes.append(f"{label}: completion run exited {done.returncode}: "
                         f"{done.stderr.strip()[-300:]}")
        if scenario.left(url) == 0:
            break
    return notes


def _db(url: str) -> Any:
    from sluice.store.db import open_database

    return open_database(url)


def _scalar(url: str, sql: str, params: dict[str, Any] | None = None) -> int:
    db = _db(url)
    try:
        with db.transaction() as tx:
            row = tx.fetchone(sql, params or {})
    finally:
        db.close()
    return int(row["n"]) if row else 0


class Scenario(Protocol):
    name: str
    job: str
    prefix: str

    def prepare(self, url: str) -> dict[str, str]: ...
    def crash_args(self, point: str) -> list[str]: ...
    def between(self, url: str) -> None: ...
    def left(self, url: str) -> int: ...
    def check(self, url: str) -> Counts: ...


# --- state-cleanup ----------------------------------------------------------------------


class Cleanup:
    name = "kill: state-cleanup"
    job = "state-cleanup"
    prefix = "state-cleanup."
    EXPIRED = 5_000 * 2 + 17
    KEPT = 40
    OTHERS = 25  # audit rows and run records, old (purged) and new (kept)

    def __init__(self, stack: ExitStack) -> None:
        pass

    def prepare(self, url: str) -> dict[str, str]:
        from sluice.store.db import utcnow

        now = utcnow()
        old = now - timedelta(days=200)
        db = _db(url)
        with db.transaction() as tx:
            tx.executemany(
                "INSERT INTO platform_state (key, value, expires_at, updated_at) "
                "VALUES (:key, '1', :expires_at, :now)",
                [{"key": f"e{i}", "expires_at": now - timedelta(seconds=i + 1), "now": now}
                 for i in range(self.EXPIRED)]
                + [{"key": f"keep{i}", "expires_at": now + timedelta(days=1), "now": now}
                   for i in range(self.KEPT)])
            tx.executemany(
                "INSERT INTO platform_state_hash (key, field, value, updated_at) "
                "VALUES (:key, :field, '1', :at)",
                [{"key": "platform:ai-envelope-threshold-firings:t1", "field": f"f{i}",
                  "at": old} for i in range(30)])
            ancient = now - timedelta(days=3 * 365)
            for prefix, at in (("old", ancient), ("new", now)):
                tx.executemany(
                    "INSERT INTO admin_audit (id, actor, action, outcome, at) "
                    "VALUES (:id, 'chaos', 'x', '200', :at)",
                    [{"id": f"{prefix}-audit-{i}", "at": at} for i in range(self.OTHERS)])
                tx.executemany(
                    "INSERT INTO job_runs (id, job, trigger, request_id, started_at, "
                    "finished_at, duration_ms, outcome, result) VALUES (:id, 'state-cleanup', "
                    "'cli', :id, :at, :at, 0, 'ok', :result)",
                    [{"id": f"{prefix}-run-{i}", "at": at, "result": tx.json({})}
                     for i in range(self.OTHERS)])
        db.close()
        return {}

    def crash_args(self, point: str) -> list[str]:
        return ["run", self.job, "--json"]

    def between(self, url: str) -> None:
        pass

    def left(self, url: str) -> int:
        return _scalar(url, "SELECT count(*) AS n FROM platform_state WHERE key LIKE 'e%'")

    def check(self, url: str) -> Counts:
        kept = _scalar(url, "SELECT count(*) AS n FROM platform_state WHERE key LIKE 'keep%'")
        hashes = _scalar(url, "SELECT count(*) AS n FROM platform_state_hash")
        audit = "SELECT count(*) AS n FROM admin_audit WHERE id LIKE :p"
        runs = "SELECT count(*) AS n FROM job_runs WHERE id LIKE :p"
        kept_others = sum(_scalar(url, q, {"p": "new-%"}) for q in (audit, runs))
        old_others = sum(_scalar(url, q, {"p": "old-%"}) for q in (audit, runs))
        return Counts(lost=self.KEPT - kept + 2 * self.OTHERS - kept_others,
                      stuck=self.left(url) + hashes + old_others)


# --- metering-flush ---------------------------------------------------------------------


class Metering:
    name = "kill: metering-flush"
    job = "metering-flush"
    prefix = "metering."
    ROWS = 6

    def __init__(self, stack: ExitStack) -> None:
        from tests.providers.polar import PolarStandIn

        self.polar = stack.enter_context(PolarStandIn(POLAR_TOKEN))
        self.ids: list[str] = []

    def prepare(self, url: str) -> dict[str, str]:
        from sluice.billing.usage import UsageEntry, insert_entries
        from sluice.store.db import utcnow

        self.polar.events.clear()
        self.polar.received.clear()
        now = utcnow()
        db = _db(url)
        insert_entries(db, [UsageEntry(id=f"use-{i}", model="m", occurred_at=now,
                                       tenant_id=f"t{i}", user_id=f"u{i}", input_tokens=1)
                            for i in range(self.ROWS)])
        with db.transaction() as tx:
            self.ids = [r["id"] for r in tx.fetchall(
                "SELECT id FROM ai_usage_metering_outbox ORDER BY id")]
        db.close()
        return {"POLAR_ACCESS_TOKEN": POLAR_TOKEN, "POLAR_API_URL": self.polar.url}

    def crash_args(self, point: str) -> list[str]:
        return ["run", self.job, "--json"]

    def between(self, url: str) -> None:
        pass

    def left(self, url: str) -> int:
        return _scalar(url, "SELECT count(*) AS n FROM ai_usage_metering_outbox "
                            "WHERE status <> 'processed'")

    def check(self, url: str) -> Counts:
        from sluice.billing.usage import MAX_METERING_ATTEMPTS

        db = _db(url)
        with db.transaction() as tx:
            rows = {r["id"]: r for r in tx.fetchall("SELECT * FROM ai_usage_metering_outbox")}
        db.close()
        counts = Counts()
        for row_id in self.ids:
            row = rows.get(row_id)
            sent = self.polar.received.get(row_id, 0)
            if row is None or (row["status"] == "processed" and sent == 0):
                counts.lost += 1
            elif row["status"] != "processed":
                counts.stuck += 1
                if row["attempt_count"] >= MAX_METERING_ATTEMPTS:
                    counts.burned += 1
            counts.duplicated += max(0, sent - 1)  # Polar deduplicates on external_id
        return counts


# --- ledger-redrive ---------------------------------------------------------------------


class Redrive:
    name = "kill: ledger-redrive"
    job = "ledger-redrive"
    prefix = "redrive."
    ENTRIES = 230  # three pages of 100

    def __init__(self, stack: ExitStack, *, redis_url: str | None = None) -> None:
        self.redis_url = redis_url or os.environ.get(REDIS_URL_ENV, DEFAULT_REDIS_URL)
        self.stack = stack
        self.prefix_now = ""

    def _client(self) -> Any:
        import redis as redis_py

        from sluice.store.redis_clients import RedisPyClient

        return RedisPyClient(redis_py.Redis.from_url(self.redis_url, decode_responses=True),
                             self.prefix_now)

    def prepare(self, url: str) -> dict[str, str]:
        from sluice.billing.usage import RetryEnvelope, UsageEntry
        from sluice.store.db import utcnow
        from sluice.store.redis_clients import LEDGER_RETRY_QUEUE

        self.prefix_now = self.stack.enter_context(redis_prefix(self.redis_url))
        now = utcnow()
        items = [RetryEnvelope.for_entry(
            UsageEntry(id=f"led-{i}", model="m", occurred_at=now, tenant_id="t1",
                       user_id=f"u{i}", input_tokens=1),
            last_error="store_unavailable: seeded", now=now).to_json()
            for i in range(self.ENTRIES)]
        client = self._client()
        client.lpush(LEDGER_RETRY_QUEUE, *items)
        client.close()
        return {"SLUICE_REDIS_URL": self.redis_url, "SLUICE_REDIS_KEY_PREFIX": self.prefix_now}

    def crash_args(self, point: str) -> list[str]:
        return ["run", self.job, "--json"]

    def between(self, url: str) -> None:
        pass

    def left(self, url: str) -> int:
        from sluice.store.redis_clients import LEDGER_RETRY_PROCESSING, LEDGER_RETRY_QUEUE

        client = self._client()
        try:
            return int(client.llen(LEDGER_RETRY_QUEUE) + client.llen(LEDGER_RETRY_PROCESSING))
        finally:
            client.close()

    def attempts_charged(self) -> int:
        """Attempts counted on the envelopes still in the lists (seeded with none)."""
        from sluice.billing.usage import RetryEnvelope
        from sluice.store.redis_clients import (
            LEDGER_RETRY_DLQ,
            LEDGER_RETRY_PROCESSING,
            LEDGER_RETRY_QUEUE,
        )

        client = self._client()
        try:
            return sum(RetryEnvelope.parse(raw).attempts
                       for name in (LEDGER_RETRY_QUEUE, LEDGER_RETRY_PROCESSING, LEDGER_RETRY_DLQ)
                       for raw in client.lrange(name, 0, -1))
        finally:
            client.close()

    def check(self, url: str) -> Counts:
        from sluice.billing.usage import RetryEnvelope
        from sluice.store.redis_clients import LEDGER_RETRY_DLQ

        client = self._client()
        dead = {RetryEnvelope.parse(raw).id for raw in client.lrange(LEDGER_RETRY_DLQ, 0, -1)}
        client.close()
        db = _db(url)
        with db.transaction() as tx:
            ledger = {r["id"]: int(r["n"]) for r in tx.fetchall(
                "SELECT id, count(*) AS n FROM ai_usage_ledger GROUP BY id")}
            outbox = {r["ledger_id"]: int(r["n"]) for r in tx.fetchall(
                "SELECT ledger_id, count(*) AS n FROM ai_usage_metering_outbox "
                "GROUP BY ledger_id")}
        db.close()
        counts = Counts(stuck=self.left(url))
        for i in range(self.ENTRIES):
            entry_id = f"led-{i}"
            if entry_id not in ledger and entry_id not in dead:
                counts.lost += 1
            extra = max(0, ledger.get(entry_id, 0) - 1) + max(0, outbox.get(entry_id, 0) - 1)
            counts.duplicated += extra
            counts.unexpected += extra  # nothing downstream deduplicates a second ledger row
            if entry_id in dead:
                counts.burned += 1
        return counts


# --- delivery-drain ---------------------------------------------------------------------


class Delivery:
    """Webhook entries (the receiver deduplicates on ``Idempotency-Key``) and Telegram
    entries (nothing deduplicates them), each enqueued with its effect record as the alert
    sweep does. After any kill and the completion runs: every entry delivered, every effect
    record there, each webhook acted on once, and at most one Telegram message sent twice
    (the send in flight when the process died, whose outcome was unknown), never three
    times."""

    name = "kill: delivery-drain"
    job = "delivery-drain"
    prefix = "delivery."
    ENTRIES = 5
    CHATS = 2

    def __init__(self, stack: ExitStack) -> None:
        from tests.providers.telegram import TelegramStandIn
        from tests.providers.webhook import WebhookReceiver

        self.hook = stack.enter_context(WebhookReceiver(WEBHOOK_SECRET))
        self.chat = stack.enter_context(TelegramStandIn(chats=("1001",)))
        self.keys: list[str] = []
        self.chat_keys: list[str] = []

    def prepare(self, url: str, *, recipient: str | None = None) -> dict[str, str]:
        from sluice.delivery.store import DeliveryStore, Effect

        self.hook.received.clear()
        self.hook.delivered.clear()
        self.chat.messages.clear()
        db = _db(url)
        store = DeliveryStore(db)
        self.keys = [f"chaos:{i}" for i in range(self.ENTRIES)]
        self.chat_keys = [f"chaos:chat:{i}" for i in range(self.CHATS)]
        for key in self.keys:
            store.enqueue("webhook", recipient or self.hook.url, {"text": key},
                          idempotency_key=key, effect=Effect("alert", "chaos", key))
        self.chat_keys.insert(0, LONG_CHAT)  # chunked (three messages): delivery.after_chunk
        for key in self.chat_keys:
            store.enqueue("telegram", "1001", {"text": _chat_text(key)}, idempotency_key=key,
                          effect=Effect("alert", "chaos", key))
        db.close()
        self.keys.append("chaos:sent-inline")
        return {"SLUICE_WEBHOOK_SIGNING_SECRET": WEBHOOK_SECRET,
                "SLUICE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
                "SLUICE_TELEGRAM_BOT_TOKEN": self.chat.token,
                "SLUICE_TELEGRAM_API_URL": self.chat.url,
                "SLUICE_DELIVERY_LEASE_SECONDS": "60"}

    def crash_args(self, point: str) -> list[str]:
        if point == "delivery.after_enqueue":  # the write-ahead path of an inline send
            return ["delivery", "enqueue", "webhook", self.hook.url, "--text", "inline",
                    "--key", "chaos:sent-inline", "--send", "--json"]
        return ["run", self.job, "--json"]

    def between(self, url: str) -> None:
        # A dead sender's lease lapses, and a backoff ends, with time: move the clock
        # instead of waiting.
        db = _db(url)
        with db.transaction() as tx:
            tx.execute("UPDATE delivery_queue SET lease_until = :past, next_attempt_at = :past "
                       "WHERE status = 'in_flight'", {"past": _utc_past()})
            tx.execute("UPDATE delivery_queue SET next_attempt_at = :past "
                       "WHERE status = 'pending'", {"past": _utc_past()})
            tx.execute("UPDATE delivery_destinations SET next_probe_at = :past",
                       {"past": _utc_past()})
        db.close()

    def left(self, url: str) -> int:
        return _scalar(url, "SELECT count(*) AS n FROM delivery_queue "
                            "WHERE status IN ('pending', 'in_flight')")

    def check(self, url: str) -> Counts:
        from sluice.delivery.store import DeliveryStatus, DeliveryStore

        db = _db(url)
        store = DeliveryStore(db)
        entries = {e.idempotency_key: e for e in store.list(limit=500)}
        recorded = store.known_effects([k for k in self.keys + self.chat_keys
                                         if k != "chaos:sent-inline"])
        db.close()
        counts = Counts()
        for key in self.keys + self.chat_keys:
            entry = entries.get(key)
            chat = key in self.chat_keys
            received = (_chat_received(self.chat.messages, key) if chat
                        else sum(1 for r in self.hook.received if r["key"] == key))
            if key != "chaos:sent-inline" and key not in recorded:
                counts.lost += 1
                counts.notes.append(f"{key}: no effect record")
            if entry is None:
                if key == "chaos:sent-inline":
                    continue  # that run did not crash before its enqueue: nothing to find
                counts.lost += 1
                continue
            if entry.status is DeliveryStatus.FAILED:
                counts.burned += 1
                if not entry.last_error:
                    counts.lost += 1
            elif entry.status is not DeliveryStatus.ACKED:
                counts.stuck += 1
            elif (chat and (received == 0 or not _chat_complete(self.chat.messages, key))) or (
                    not chat and key not in self.hook.delivered):
                counts.lost += 1
            counts.duplicated += max(0, received - 1)
            if chat:  # nothing deduplicates a chat: only the in-flight send may repeat, once
                counts.unexpected += max(0, received - 2)
        twice = sum(1 for key in self.chat_keys if _chat_received(self.chat.messages, key) > 1)
        if twice > 1:
            counts.unexpected += twice - 1
            counts.notes.append(f"{twice} chat entries sent twice in one run")
        return counts


LONG_CHAT = "chaos:chat:long"


def _chat_text(key: str) -> str:
    """A chat entry's text: its key, or for LONG_CHAT about 9,000 characters of numbered
    lines, which Telegram's 4,096-character limit cuts into three messages."""
    if key != LONG_CHAT:
        return key
    return "\n".join(f"{key} line {n:03d} " + "y" * 48 for n in range(150))


def _chat_received(messages: list[dict[str, Any]], key: str) -> int:
    """How often the entry's first message reached the chat (a chunk sent again shows here
    only when the first one repeats; the rest are checked by _chat_complete)."""
    first = _chat_text(key).splitlines()[0]
    return sum(1 for m in messages if m["text"] == key or (
        key == LONG_CHAT and m["text"].startswith(first)))


def _chat_complete(messages: list[dict[str, Any]], key: str) -> bool:
    if key != LONG_CHAT:
        return True
    lines = {line for m in messages for line in m["text"].splitlines()}
    return all(line in lines for line in _chat_text(key).splitlines())


def _utc_past() -> Any:
    from sluice.store.db import utcnow

    return utcnow() - timedelta(hours=1)


# --- erasure-purge ----------------------------------------------------------------------


class Erasure:
    name = "kill: erasure-purge"
    job = "erasure-purge"
    prefix = "erasure."
    SUBJECTS = ("gone-a", "gone-b", "gone-c")
    WAITING = "waiting-d"
    OTHERS = ("keep-x", "keep-y")
    ROWS = 4

    def __init__(self, stack: ExitStack) -> None:
        self.partial = 0
        self.seeded: dict[str, int] = {}

    def prepare(self, url: str) -> dict[str, str]:
        from sluice.billing.usage import UsageEntry, insert_entries
        from sluice.erasure.requests import ErasureStore
        from sluice.store.db import utcnow

        self.partial = 0
        now = utcnow()
        db = _db(url)
        users = (*self.SUBJECTS, self.WAITING, *self.OTHERS)
        insert_entries(db, [UsageEntry(id=f"{u}-{i}", model="m", occurred_at=now,
                                       tenant_id="t1", user_id=u, input_tokens=1)
                            for u in users for i in range(self.ROWS)])
        with db.transaction() as tx:
            tx.executemany("INSERT INTO platform_state (key, value, updated_at) "
                           "VALUES (:k, '1', :now)",
                           [{"k": f"tenant:t1:user:{u}:k{i}", "now": now}
                            for u in users for i in range(self.ROWS)])
        store = ErasureStore(db)
        for subject in self.SUBJECTS:
            store.create(subject, requested_by="chaos", grace_days=0, now=now - timedelta(1))
        store.create(self.WAITING, requested_by="chaos", grace_days=30, now=now)
        db.close()
        self.seeded = self._held(url)
        return {}

    def crash_args(self, point: str) -> list[str]:
        return ["run", self.job, "--json"]

    def _held(self, url: str) -> dict[str, int]:
        from sluice.core.observe import Reporter
        from sluice.core.services import Services
        from sluice.core.settings import Settings
        from sluice.erasure.purge import count_subject

        db = _db(url)
        services = Services(Settings(database_url=url), db, Reporter())
        try:
            return {u: sum(count_subject(services, u).values())
                    for u in (*self.SUBJECTS, self.WAITING, *self.OTHERS)}
        finally:
            services.close()

    def between(self, url: str) -> None:
        # Whole or not at all: after a kill each due subject has all its rows or none.
        held = self._held(url)
        self.partial += sum(1 for u in self.SUBJECTS if held[u] not in (0, self.seeded[u]))

    def left(self, url: str) -> int:
        return _scalar(url, "SELECT count(*) AS n FROM data_erasure_requests WHERE "
                            "subject_user_id <> :w AND (status = 'requested' OR "
                            "(status = 'purged' AND verified_at IS NULL))", {"w": self.WAITING})

    def check(self, url: str) -> Counts:
        held = self._held(url)
        failed = _scalar(url, "SELECT count(*) AS n FROM data_erasure_requests "
                              "WHERE status = 'failed'")
        kept = [u for u in (self.WAITING, *self.OTHERS) if held[u] != self.seeded[u]]
        return Counts(lost=len(kept) + self.partial,
                      stuck=self.left(url) + sum(1 for u in self.SUBJECTS if held[u]),
                      burned=failed,
                      notes=[f"partial purge seen after a kill ({self.partial})"]
                      if self.partial else [])


SCENARIOS: tuple[type[Any], ...] = (Cleanup, Metering, Redrive, Delivery, Erasure,
                                    ConsumerKill, ConsumerKillBatch)


@dataclass
class Plan:
    backends: tuple[str, ...]
    positions: tuple[int, ...]


def scenarios_for(point: str, scenarios: list[Any]) -> list[Any]:
    return [scenario for scenario in scenarios if point.startswith(scenario.prefix)]


def one_run(scenario: Any, stores: ScratchStores, backend: str, point: str, nth: int,
            ) -> tuple[Counts, bool]:
    """Seed, kill at ``point@nth``, finish, check; ``(counts, the kill happened)``."""
    url = stores.fresh(backend)
    try:
        env = {"CRON_SECRET": CRON_SECRET, "SLUICE_STAGE": "chaos", "SLUICE_DATABASE_URL": url,
               **scenario.prepare(url)}
        crashed = sluice(scenario.crash_args(point), env, crash_at=f"{point}@{nth}",
                         module=_module(scenario))
        reached = crashed.returncode == CRASH_EXIT_CODE
        notes: list[str] = []
        if not reached and crashed.returncode != 0:
            notes.append(f"{point}@{nth}: crash run exited {crashed.returncode}: "
                         f"{crashed.stderr.strip()[-300:]}")
        notes += run_to_completion(scenario, url, env, f"{point}@{nth}")
        counts = scenario.check(url)
        counts.notes = notes + counts.notes
        return counts, reached
    finally:
        stores.drop(url)


@contextmanager
def _scenarios() -> Iterator[list[Any]]:
    with ExitStack() as stack:
        yield [cls(stack) for cls in SCENARIOS]


def sweep(plan: Plan, *, points: list[str] | None = None,
          progress: Any = None) -> list[Tally]:
    """One tally per scenario and backend; a point no scenario drives is a failed tally."""
    names = points if points is not None else discover()
    tallies: dict[str, Tally] = {}
    with _scenarios() as scenarios, ScratchStores() as stores:
        for backend in plan.backends:
            for point in names:
                matching = scenarios_for(point, scenarios)
                if not matching:
                    tally = tallies.setdefault(f"kill: {point} (no scenario)",
                                               Tally(f"kill: {point} (no scenario)"))
                    tally.stuck += 1
                    tally.notes.append(f"crash point {point} has no seeded scenario")
                    continue
                for scenario in matching:
                    key = f"{scenario.name} [{backend}]"
                    tally = tallies.setdefault(key, Tally(key))
                    for nth in plan.positions:
                        counts, reached = one_run(scenario, stores, backend, point, nth)
                        tally.add(counts)
                        tally.reached += int(reached)
                        if reached:
                            tally.points_reached.add(point)
                        if progress is not None:
                            progress(f"{key} {point}@{nth}: reached={reached} {counts}")
    return list(tallies.values())


def result_json(tallies: list[Tally]) -> str:
    return json.dumps([{**t.__dict__, "points_reached": sorted(t.points_reached)}
                       for t in tallies], indent=2)


# --- kills from outside at random moments -----------------------------------------------


def killed_from_outside(scenario: Any, stores: ScratchStores, backend: str,
                        delay_s: float) -> tuple[Counts, bool]:
    """The drain SIGKILLed ``delay_s`` after it started (if still running), then finished."""
    url = stores.fresh(backend)
    try:
        env = {"CRON_SECRET": CRON_SECRET, "SLUICE_STAGE": "chaos", "SLUICE_DATABASE_URL": url,
               **scenario.prepare(url)}
        proc = subprocess.Popen([sys.executable, "-m", _module(scenario),
                                 *_finish_args(scenario)], env=_env(env), cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=delay_s)
            killed = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            killed = True
        notes = run_to_completion(scenario, url, env, f"after a kill at {delay_s:.2f} s")
        counts = scenario.check(url)
        counts.notes = notes + counts.notes
        return counts, killed
    finally:
        stores.drop(url)


def random_kills(backends: tuple[str, ...], *, seed: int = 14, per_drain: int = 4,
                 progress: Any = None) -> list[Tally]:
    """``per_drain`` kills per drain and store, at moments drawn from ``seed``: the same
    moments every run (where the drain is at that moment depends on the machine)."""
    import random

    rng = random.Random(seed)
    tallies = []
    with _scenarios() as scenarios, ScratchStores() as stores:
        for backend in backends:
            for scenario in scenarios:
                if isinstance(scenario, Metering):
                    scenario.polar.latency_s = 0.05  # a run long enough to be cut
                tally = Tally(f"{scenario.name.replace('kill:', 'kill -9 at random:')} "
                              f"[{backend}]")
                for _ in range(per_drain):
                    delay = rng.uniform(0.15, 0.7)
                    counts, killed = killed_from_outside(scenario, stores, backend, delay)
                    tally.add(counts)
                    tally.reached += int(killed)
                    if progress is not None:
                        progress(f"{tally.scenario} at {delay:.2f} s: killed={killed} {counts}")
                if isinstance(scenario, Metering):
                    scenario.polar.latency_s = 0.0
                tallies.append(tally)
    return tallies
