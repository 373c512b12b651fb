"""The seed-parity table is checked: every row names the tests that show it, and every name
is a test function pytest collects (``tests/<path>.py::test_name`` or
``tests/<path>.py::TestClass::test_name``). A row says "same", or what differs and why.
The few facts no other test covers are checked here."""

from __future__ import annotations

import ast
import re
import sqlite3
from functools import cache
from pathlib import Path
from typing import Any

from sluice.store.db import open_database
from sluice.store.migrate import migrate
from tests.conftest import ROOT

TABLE = ROOT / "docs" / "seed-parity.md"
REFERENCE = re.compile(r"tests/[\w/]+\.py::[\w:]+")
VERDICTS = ("same", "difference", "addition", "not built", "not applicable")


def rows(text: str) -> list[list[str]]:
    """The body rows of every table: cells split on unescaped pipes, header and rule skipped."""
    found = []
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        if index + 1 < len(lines) and set(lines[index + 1]) <= set("|-: ") and \
                lines[index + 1].startswith("|"):
            continue  # a header row
        found.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return found


@cache
def collected(path: str) -> frozenset[str]:
    """The test functions pytest collects from one module: ``name`` or ``Class::name``."""
    file = ROOT / path
    if not file.is_file():
        return frozenset()
    names = set()
    for node in ast.parse(file.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                node.name.startswith("test"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names.update(f"{node.name}::{item.name}" for item in node.body
                         if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                         and item.name.startswith("test"))
    return frozenset(names)


def unresolved(cell: str) -> list[str]:
    """The references in ``cell`` that name no collected test (none at all is one too)."""
    references = REFERENCE.findall(cell)
    if not references:
        return [f"no test named in {cell!r}"]
    missing = []
    for reference in references:
        path, _, name = reference.partition("::")
        if name not in collected(path):
            missing.append(reference)
    return missing


def test_every_row_names_tests_that_exist() -> None:
    body = rows(TABLE.read_text())
    assert body, "the table has rows"
    problems = []
    for cells in body:
        if len(cells) != 4:
            problems.append(f"{cells[:1]}: {len(cells)} cells, not 4")
            continue
        problems += [f"{cells[0][:60]}: {miss}" for miss in unresolved(cells[3])]
    assert problems == []


def test_every_row_says_same_or_what_differs_and_why() -> None:
    problems = []
    for behaviour, _where, parity, _tests in rows(TABLE.read_text()):
        verdict = next((v for v in VERDICTS if parity.lower().startswith(v)), None)
        if verdict is None:
            problems.append(f"{behaviour[:60]}: parity {parity[:40]!r}")
        elif verdict != "same" and len(parity) < len(verdict) + 20:
            problems.append(f"{behaviour[:60]}: a {verdict} without its reason")
    assert problems == []


def test_the_row_count_the_page_states_is_the_tables() -> None:
    text = TABLE.read_text()
    stated = re.search(r"\*\*(\d+) rows\*\*", text)
    assert stated, "the page states how many behaviours it lists"
    assert int(stated.group(1)) == len(rows(text))


def test_the_check_itself() -> None:
    this = "tests/unit/test_seed_parity.py"
    assert unresolved(f"`{this}::test_the_check_itself`") == []
    assert unresolved(f"`{this}::test_no_such_test`") == [f"{this}::test_no_such_test"]
    assert unresolved("`tests/unit/no_such_file.py::test_x`") == [
        "tests/unit/no_such_file.py::test_x"]
    assert unresolved("same, no test") == ["no test named in 'same, no test'"]
    assert rows("| a | b |\n|---|---|\n| c \\| d | e |\n") == [["c \\| d", "e"]]


# --- facts of the table that no other test covers ---------------------------------------


def test_one_region_per_stage_pinned_in_serverless_yml() -> None:
    text = (ROOT / "serverless.yml").read_text()
    provider = text[text.index("\nprovider:"):text.index("\ncustom:")]
    assert re.findall(r"^  region: (.+)$", provider, re.MULTILINE) == [
        "${param:region, 'eu-north-1'}"]


def test_the_active_delivery_index_is_partial_on_status_and_due_time(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'parity.db'}"
    database = open_database(url)
    migrate(database)
    database.close()
    with sqlite3.connect(tmp_path / "parity.db") as connection:
        [(sql,)] = connection.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'delivery_queue_active_idx'").fetchall()
        [(due,)] = connection.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'delivery_queue_due_idx'").fetchall()
    assert "(status, next_attempt_at)" in sql
    assert "WHERE status IN ('pending', 'in_flight')" in sql
    # the claim's own, which the row names
    assert "(next_attempt_at, enqueued_at, id)" in due
    assert "WHERE status = 'pending' AND held_by IS NULL" in due


# --- the numbers of the table against the code ------------------------------------------
# A "same" row's number is the document's (its behaviour cell) and must be the code's; a
# difference's number is Sluice's (its where and parity cells) and must be the code's.


def row(prefix: str) -> list[str]:
    """The one row whose behaviour cell starts with ``prefix``."""
    found = [cells for cells in rows(TABLE.read_text()) if cells[0].startswith(prefix)]
    assert len(found) == 1, f"{len(found)} rows start with {prefix!r}"
    return found[0]


def numbers(cell: str, pattern: str) -> list[float]:
    """Every number ``pattern``'s groups capture in ``cell`` (thousands commas allowed)."""
    match = re.search(pattern, cell)
    assert match, f"{pattern!r} not in {cell[:120]!r}"
    return [float(group.replace(",", "")) for group in match.groups()]


def same(prefix: str) -> list[str]:
    cells = row(prefix)
    assert cells[2].startswith("same"), f"{prefix!r} is no longer 'same': check its numbers"
    return cells


def test_the_numbers_of_same_rows_are_the_codes() -> None:
    from sluice.alerts.sweep import SWEEP_CONCURRENCY
    from sluice.billing.ledger_redrive import DEFAULT_REDRIVE_BATCH_SIZE, MAX_ATTEMPTS
    from sluice.billing.usage import MAX_METERING_ATTEMPTS
    from sluice.core.settings import Settings
    from sluice.delivery.classify import MAX_DEPTH
    from sluice.delivery.retry import DEFAULT_POLICY
    from sluice.jobs.cleanup import THRESHOLD_FIRING_PREFIX, THRESHOLD_FIRING_RETENTION_DAYS
    from sluice.jobs.registry import get_job
    from sluice.queues.consumer import ERROR_MESSAGE_LIMIT, backoff_s
    from sluice.rss.tick import ROTATION_WINDOW_MS

    defaults = Settings._field_defaults
    seed = {  # behaviour prefix -> (pattern over the behaviour cell, the code's values)
        "The tick's time is": (r"maxDuration = (\d+)", [get_job("rss-refresh").timeout_s]),
        "Under `ERMIS_TENANT": (r"default (\d+)", [defaults["tenant_ingestion_budget_ms"]]),
        "Rotation offset": (r"/ (\d+)\)", [ROTATION_WINDOW_MS]),
        "The sweep runs in batches": (r"= (\d+)", [SWEEP_CONCURRENCY]),
        "Eligible rows:": (r"attempt_count < (\d+)", [MAX_METERING_ATTEMPTS]),
        "Batch size `DEFAULT_REDRIVE": (r"= (\d+)", [DEFAULT_REDRIVE_BATCH_SIZE]),
        "`MAX_ATTEMPTS = 10`": (r"MAX_ATTEMPTS = (\d+)", [MAX_ATTEMPTS]),
        "Deletes `platform_state_hash`": (r"older than (\d+) days",
                                          [THRESHOLD_FIRING_RETENTION_DAYS]),
        "`errorMessage` truncated": (r"to (\d+) characters", [ERROR_MESSAGE_LIMIT]),
        "Depth limit": (r"limit (\d+)", [MAX_DEPTH]),
        "Defaults: 3 attempts": ((r"(\d+) attempts, (\d+) ms min, (\d+) s max, (\d+) jitter; "
                                 r"factor (\d+)"),
                                 [DEFAULT_POLICY.attempts, DEFAULT_POLICY.min_delay_s * 1000,
                                  DEFAULT_POLICY.max_delay_s, DEFAULT_POLICY.jitter,
                                  DEFAULT_POLICY.factor]),
    }
    for prefix, (pattern, code) in seed.items():
        assert numbers(same(prefix)[0], pattern) == [float(v) for v in code], prefix
    assert f"under `{THRESHOLD_FIRING_PREFIX}`" in row("Deletes `platform_state_hash`")[0]
    [cap] = numbers(same("Retry backoff")[0], r"Math\.min\((\d+), 2 \*\* deliveryCount\)")
    assert [backoff_s(n) for n in range(12)] == [min(int(cap), 2 ** n) for n in range(12)]
    # numbers Sluice states in same rows' parity cells
    from sluice.core.settings import fields
    from sluice.delivery.chunking import TELEGRAM_MAX_TEXT

    batch = fields()["metering_events_per_request"]
    assert numbers(same("One row at a time")[2], r"\((\d+)\u2013(\d+)\)") == [batch.lo, batch.hi]
    assert numbers(same("Chunking")[2], r"Telegram's limit \((\d+)\)") == [TELEGRAM_MAX_TEXT]
    # the rss-refresh budget the where cell names
    assert numbers(row("The tick's time is")[1], r"timeout (\d+) s, budget (\d+) s") == [
        get_job("rss-refresh").timeout_s, get_job("rss-refresh").budget_s]


def test_the_numbers_sluice_states_in_differences_are_the_codes() -> None:
    from sluice.billing.metering import DEFAULT_FLUSH_LIMIT
    from sluice.core.settings import Settings
    from sluice.delivery.classify import PERMANENT_PATTERNS
    from sluice.delivery.policy import DEFAULT_SCHEDULE
    from sluice.erasure.purge import MAX_PURGE_ATTEMPTS
    from sluice.jobs.registry import get_job
    from sluice.queues.topics import MAX_ATTEMPTS, VISIBILITY_TIMEOUT_S

    defaults = Settings._field_defaults
    yml = (ROOT / "serverless.yml").read_text()
    [visibility] = numbers(yml, r"visibilityTimeout: (\d+)")
    [receives] = numbers(yml, r"maxReceiveCount: (\d+)")
    [consumer_timeout] = numbers(yml, r"consumerTimeout: (\d+)")
    drain = get_job("delivery-drain")
    checks = {  # behaviour prefix -> (cell, pattern, the code's values)
        "`flushAiMeteringOutbox": (2, r"limit ([\d,]+) rows", [DEFAULT_FLUSH_LIMIT]),
        "A purge that raised": (1, r"MAX_PURGE_ATTEMPTS = (\d+)", [MAX_PURGE_ATTEMPTS]),
        "`visibilityTimeoutSeconds": (2, (r"same (\d+) attempts.*visibility is (\d+) s, not "
                                         r"(\d+) s.*timeout \((\d+) s\)"),
                                      [MAX_ATTEMPTS, visibility, VISIBILITY_TIMEOUT_S,
                                       consumer_timeout]),
        "The queue service has no dead-letter": (2, r"`maxReceiveCount` (\d+)", [receives]),
        "`isPermanentDeliveryError`": (2, r"(\d+) patterns", [len(PERMANENT_PATTERNS)]),
        "Seven permanent patterns": (2, r"among (\d+) patterns", [len(PERMANENT_PATTERNS)]),
        "The drain respects": (2, r"(\d+) s inside a (\d+) s function",
                               [drain.budget_s, drain.timeout_s]),
        "Expired entries": (2, r"`SLUICE_DELIVERY_RETENTION_DAYS` \((\d+)\)",
                            [defaults["delivery_retention_days"]]),
        "Tiers 5 s": (0, r"Tiers (\d+) s, (\d+) s, (\d+) s, (\d+) s", DEFAULT_SCHEDULE.delays_s),
        "`MAX_RETRIES": (0, r"MAX_RETRIES = (\d+)", [DEFAULT_SCHEDULE.max_attempts]),
    }
    for prefix, (cell, pattern, code) in checks.items():
        assert numbers(row(prefix)[cell], pattern) == [float(v) for v in code], prefix
    assert numbers(row("Expired entries")[1], r"\((\d+) day\)") == [
        defaults["delivery_expire_s"] / 86400]
    assert numbers(row("`MAX_RETRIES")[2], r"`SLUICE_DELIVERY_EXPIRE_SECONDS` \((\d+) h\)") == [
        defaults["delivery_expire_s"] / 3600]
    # a drain run prunes once, and the drain runs every minute
    assert "each drain run prunes once (every minute)" in row("A prune timer")[2]
    assert drain.schedule == "rate(1 minute)"
    # the tiers' difference: the waits before a fifth failure ends it
    waits = [step for _, step in DEFAULT_SCHEDULE.table() if step is not None]
    assert numbers(row("Tiers 5 s")[2], r"\(five attempts in all.* ([\d.]+) min of waits\)") == [
        sum(waits) / 60]


def test_the_permanent_patterns_the_document_names_are_permanent_in_any_case() -> None:
    from sluice.delivery.classify import matches_permanent

    behaviour, _where, parity, _tests = row("Seven permanent patterns")
    named = re.findall(r"`([^`]+)`", behaviour)
    assert len(named) == 7
    for pattern in named:
        text = pattern.replace(".*", " for this ")
        assert matches_permanent(text) and matches_permanent(text.upper()), pattern
    assert not matches_permanent("connection reset by peer")
    # the one the row says is broader: a kick worded without "Forbidden:"
    assert parity.startswith("difference in one of the seven: `forbidden: bot was kicked`")
    assert matches_permanent("Bad Request: bot was kicked from the supergroup chat")


def test_the_job_count_is_the_registrys() -> None:
    from sluice.jobs.registry import JOBS

    words = {"five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}
    seed_count = words[numbers_word(row("Five cron jobs")[0])]
    sluice_count = words[numbers_word(row("Five cron jobs")[2].removeprefix("addition: "))]
    assert seed_count == 5 and sluice_count == len(JOBS.using(()))


def numbers_word(cell: str) -> str:
    return cell.split()[0].strip(";,:").lower()


# --- facts of rows whose tests elsewhere do not show them --------------------------------


def test_the_four_topics_are_the_tables() -> None:
    from sluice.queues.topics import TOPICS

    named = re.findall(r"`([^`]+)`", same("Four topics in one table")[0])
    assert named == list(TOPICS.using(()))


class _Refusing:
    """An adapter whose every send raises ``error`` (no network)."""

    name = "slack"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def outage_key(self, entry: object) -> str:
        return "slack:C0ALERTS"

    def send(self, entry: object, progress: object = None) -> str:
        raise self.error


def test_the_drain_and_inline_delivery_classify_alike(sqlite_url: str) -> None:
    from datetime import timedelta

    from sluice.delivery.drain import Deliverer, SendOutcome
    from sluice.delivery.store import DeliveryStatus, DeliveryStore
    from sluice.jobs.registry import Deadline

    db = open_database(sqlite_url)
    try:
        for error, status in ((RuntimeError("slack: msg_too_long"), DeliveryStatus.FAILED),
                              (RuntimeError("connection reset by peer"), DeliveryStatus.PENDING)):
            store = DeliveryStore(db)
            deliverer = Deliverer(store, {"slack": _Refusing(error)},  # type: ignore[dict-item]
                                  lease=timedelta(seconds=30))
            inline, outcome = deliverer.deliver("slack", "C0ALERTS", {"text": "inline"})
            queued, _ = store.enqueue("slack", "C0ALERTS", {"text": "queued"})
            summary = deliverer.drain(Deadline(30))
            inline, queued = store.get(inline.id), store.get(queued.id)
            assert inline.status is queued.status is status, error
            if status is DeliveryStatus.FAILED:
                assert outcome is SendOutcome.FAILED and summary["failed"] == 1
                assert inline.failure_reason == queued.failure_reason == "permanent"
            else:
                assert outcome is not SendOutcome.FAILED and summary["failed"] == 0
            with db.transaction() as tx:
                tx.execute("DELETE FROM delivery_queue", {})
                tx.execute("DELETE FROM delivery_destinations", {})
    finally:
        db.close()


def test_each_drain_writes_queue_drained_as_a_log_record_and_metrics() -> None:
    import logging

    from sluice.core.observe import Reporter
    from sluice.delivery.drain import DrainSummary, report_drained

    class Recording(Reporter):
        def __init__(self) -> None:
            super().__init__()
            self.recorded: list[tuple[dict[str, float], dict[str, str]]] = []

        def metrics(self, values: dict[str, float], unit: str = "Count", **dims: str) -> None:
            self.recorded.append((values, dims))

    class Kept(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    summary = DrainSummary(recovered=2, failed=1, skippedMaxRetries=0, deferredBackoff=3,
                           expired=0, expiredWaiting={}, unknown=0, leftDue=0,
                           unconfigured={"count": 0, "channels": {}},
                           outages={"count": 0, "down": {}, "destinations": []},
                           rateLimited=0, notSent=0, notSentError=None, fatal=0,
                           fatalError=None, disabled={}, failedDisabled=0, paused=0)
    kept, reporter = Kept(), Recording()
    logging.getLogger("sluice").addHandler(kept)
    try:
        report_drained(summary, reporter)
    finally:
        logging.getLogger("sluice").removeHandler(kept)
    [record] = [r for r in kept.records if r.getMessage() == "queue_drained"]
    assert record.__dict__["event"] == "queue_drained"
    assert record.__dict__["summary"] == dict(summary)
    [(values, dims)] = reporter.recorded
    assert dims == {"event": "queue_drained"}
    assert (values["QueueDrained.recovered"], values["QueueDrained.deferredBackoff"]) == (2, 3)


def test_an_unknown_entry_is_neither_expired_nor_pruned(sqlite_url: str) -> None:
    from datetime import timedelta

    from sluice.delivery.store import DeliveryStatus, DeliveryStore
    from sluice.store.db import utcnow

    db = open_database(sqlite_url)
    try:
        store = DeliveryStore(db)
        old, lease = utcnow() - timedelta(days=30), timedelta(seconds=30)
        for text in ("acked", "failed", "unknown"):
            store.enqueue("telegram", "1001", {"text": text}, now=old)
        at = old
        for entry in store.claim(lease, limit=3, now=at):
            if entry.payload["text"] == "acked":
                store.ack(entry, "1", 1, now=at)
            elif entry.payload["text"] == "failed":
                store.fail(entry, "Bad Request: message is too long", now=at)
            else:
                store.nack(entry, "sent; no answer", unknown=True, now=at)
        at += timedelta(minutes=1)
        [again] = store.claim(lease, now=at)  # the one resend a chat allows, again unknown
        assert store.nack(again, "sent; no answer", unknown=True, now=at) is \
            DeliveryStatus.UNKNOWN
        assert sum(store.expire(timedelta(days=1)).values()) == 0
        assert store.prune(utcnow() - timedelta(days=7)) == 2
        assert [e.status for e in store.list()] == [DeliveryStatus.UNKNOWN]
    finally:
        db.close()


def test_the_simulator_bounds_the_delivery_queue() -> None:
    from datetime import UTC, datetime

    from bench.simulate.invariants import BOUNDED_TABLES, GROWTH_FACTOR, Judge

    assert "delivery_queue" in BOUNDED_TABLES
    start = datetime(2026, 1, 1, tzinfo=UTC)
    judge = Judge(start)
    judge.bounded(start, {"delivery_queue": 400}, {"delivery_queue": int(400 * GROWTH_FACTOR)})
    assert judge.violations == []
    judge.bounded(start, {"delivery_queue": 400},
                  {"delivery_queue": int(400 * GROWTH_FACTOR) + 1})
    assert [v.invariant for v in judge.violations] == ["bounded_tables"]


def test_a_tenant_without_a_rules_row_is_invisible_to_the_sweep(
        sqlite_url: str, make_services: Any, monkeypatch: Any) -> None:
    from sluice.alerts.rules import RulesStore, rules_key
    from sluice.alerts.sweep import run_alert_sweep
    from sluice.jobs.registry import Deadline
    from sluice.rss.store import RssStore
    from sluice.store.state import StateStore

    svc = make_services(sqlite_url)
    RssStore(svc.db).put_scope("quiet", "tenant-quiet", (), "en", True)
    StateStore(svc.db).put(rules_key("loud"), {"rules": []})
    asked: list[str] = []
    read = RulesStore.get
    monkeypatch.setattr(RulesStore, "get",
                        lambda self, scope_id: asked.append(scope_id) or read(self, scope_id))
    run_alert_sweep(svc, Deadline(30))
    assert "quiet" in RssStore(svc.db).completed_scope_ids()
    assert asked == ["loud"], "only the scopes with a rules row are read"
