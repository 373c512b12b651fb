"""The seed-parity table is checked: every row names the tests that show it, and every name
is a test function pytest collects (``tests/<path>.py::test_name`` or
``tests/<path>.py::TestClass::test_name``). A row says "same", or what differs and why.

A "same" row names its behaviour test as ``<surface>: `tests/…::test_…```: a test that
drives the behaviour through the product's own surface, read here from the test's source
(the test, the helpers and fixtures it names, followed through the test modules): it must
reach that surface, must not read this page, and must not replace product code with a
stub unless ``FAULTS`` says which fault it injects and why."""

from __future__ import annotations

import ast
import re
import sqlite3
from functools import cache
from pathlib import Path
from typing import NamedTuple

from sluice.store.db import open_database
from sluice.store.migrate import migrate
from tests.conftest import ROOT

TABLE = ROOT / "docs" / "seed-parity.md"
REFERENCE = re.compile(r"tests/[\w/]+\.py::[\w:]+")
VERDICTS = ("same", "difference", "addition", "not built", "not applicable")

# How a behaviour test reaches each surface, as its source shows it.
SURFACES = {
    "route": r"\bTestClient\(|\bcreate_app\(",  # the FastAPI app, in process
    "handler": r"\bload_event\(",  # a Lambda entry point with an event from tests/events
    "job": r"\brun_job\(",  # a registered job through the job runner
    "consumer": r"\.lambda_handler\b|\.deliver_local\(",  # a consumer with SQS-shaped input
    "cli": r"\brun_cli\(|\bmain\(\[",  # the command line
    "page": r"\bpage\.goto\(",  # the console in Chromium
    "deploy": r"\bpackaged\b",  # the template osls packages
}
BEHAVIOUR = re.compile(r"\b(" + "|".join(SURFACES) + r"): `(tests/[\w/]+\.py::[\w:]+)`")
# Product code replaced inside a test: monkeypatching, a method assigned over, or a stand-in
# registered as the refresh.
STUB = re.compile(r"\bmonkeypatch\.set(attr|item)\(|\bregister_catalog_refresh\((?!None)"
                  r"|# type: ignore\[method-assign\]")
# The helpers of this module that read the page: a test that uses one reads the page.
PAGE_HELPERS = frozenset({"TABLE", "rows", "row", "numbers", "table_rows"})
# Behaviour tests that replace product code on purpose: the fault each one injects.
FAULTS: dict[str, str] = {
    "tests/e2e/http/test_http.py::test_a_crashing_job_answers_a_typed_500":
        "puts a job that raises where state-cleanup was: the unexpected throw itself",
    "tests/integration/rss/test_store_outage.py::"
    "test_a_sqlite_lock_past_the_busy_timeout_in_one_tenants_refresh_is_its_failure":
        "shortens SQLite's busy timeout to 1 s, so a lock held by another connection is an "
        "outage within a second",
    "tests/integration/queues/test_parity_quarantine.py::"
    "test_a_rejection_whose_quarantine_is_locked_waits_as_a_delayed_copy":
        "shortens SQLite's busy timeout to 1 s, so a lock held by another connection is an "
        "outage within a second",
    "tests/integration/delivery/test_parity_delivery.py::"
    "test_a_locked_sqlite_store_is_an_outage_the_next_run_recovers_from":
        "shortens SQLite's busy timeout to 1 s, so a lock held by another connection is an "
        "outage within a second",
}
# "same" rows whose behaviour test is still being written (empty when the work is done).
AWAITING: tuple[str, ...] = ()  # the start of each such row's behaviour cell


class Row(NamedTuple):
    line: int
    section: str
    behaviour: str
    where: str
    parity: str
    tests: str

    @property
    def verdict(self) -> str | None:
        return next((v for v in VERDICTS if self.parity.lower().startswith(v)), None)


def cells_of(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def table_rows(text: str) -> list[Row]:
    """The body rows of every table, with their line and section; header and rule skipped."""
    found, section = [], ""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("## "):
            section = line[3:].strip()
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        if index + 1 < len(lines) and set(lines[index + 1]) <= set("|-: ") and \
                lines[index + 1].startswith("|"):
            continue  # a header row
        cells = cells_of(line)
        cells += [""] * (4 - len(cells))
        found.append(Row(index + 1, section, *cells[:4]))
    return found


def rows(text: str) -> list[list[str]]:
    """The body rows of every table: cells split on unescaped pipes."""
    return [cells_of(line) for line in (text.splitlines()[r.line - 1]
                                        for r in table_rows(text))]


@cache
def _text(path: str) -> str:
    file = ROOT / path
    return file.read_text() if file.is_file() else ""


@cache
def _lines(path: str) -> list[str]:
    return _text(path).splitlines()


@cache
def _module(path: str) -> ast.Module | None:
    return ast.parse(_text(path)) if (ROOT / path).is_file() else None


@cache
def collected(path: str) -> frozenset[str]:
    """The test functions pytest collects from one module: ``name`` or ``Class::name``."""
    module = _module(path)
    if module is None:
        return frozenset()
    names = set()
    for node in module.body:
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


# --- what a test reaches ------------------------------------------------------------------


@cache
def _definitions(path: str) -> dict[str, ast.AST]:
    module = _module(path)
    found: dict[str, ast.AST] = {}
    for node in module.body if module else ():
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found.update((t.id, node) for t in targets if isinstance(t, ast.Name))
    return found


@cache
def _test_imports(path: str) -> dict[str, tuple[str, str]]:
    """Names this module imports from other test modules: name -> (their path, their name)."""
    module = _module(path)
    found = {}
    for node in ast.walk(module) if module else ():
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
            other = node.module.replace(".", "/") + ".py"  # type: ignore[union-attr]
            for alias in node.names:
                found[alias.asname or alias.name] = (other, alias.name)
    return found


@cache
def _conftests(path: str) -> list[str]:
    parts = Path(path).parent.parts
    return [str(Path(*parts[:n], "conftest.py")) for n in range(len(parts), 0, -1)
            if (ROOT / Path(*parts[:n], "conftest.py")).is_file()]


def _autouse(node: ast.AST) -> bool:
    """A fixture every test below its conftest gets without naming it."""
    return isinstance(node, ast.FunctionDef) and any(
        isinstance(d, ast.Call) and any(k.arg == "autouse" and isinstance(k.value, ast.Constant)
                                        and k.value.value is True for k in d.keywords)
        for d in node.decorator_list)


def _autouse_fixtures(path: str) -> list[tuple[str, ast.AST]]:
    """The autouse fixtures of the conftests above ``path`` that apply to its tests: the
    nearest definition of each name (the test module's own one overrides them all)."""
    found: dict[str, tuple[str, ast.AST]] = {}
    for conftest in _conftests(path):
        for name, node in _definitions(conftest).items():
            if _autouse(node) and name not in found:
                found[name] = (conftest, node)
    own = _definitions(path)
    return [(where, node) if name not in own else (path, own[name])
            for name, (where, node) in found.items()]


class Reach(NamedTuple):
    source: str  # the source of everything the test reaches, joined
    reads_page: bool


@cache
def reach(reference: str) -> Reach:
    """What a collected test runs, as far as its source shows: the test, the autouse
    fixtures of the conftests above it, and (followed through the test modules) the
    helpers, classes, constants and fixtures they name."""
    path, _, name = reference.partition("::")
    *owner, function = name.split("::")
    definitions = _definitions(path)
    start = definitions.get(owner[0] if owner else function)
    if start is None:
        return Reach("", False)
    # the test, and the fixtures it gets without naming them
    pending: list[tuple[str, ast.AST]] = [(path, start), *_autouse_fixtures(path)]
    seen: set[tuple[str, str]] = set()
    sources, reads_page = [], False
    while pending:
        where, node = pending.pop()
        key = (where, str(getattr(node, "lineno", 0)))
        if key in seen:
            continue
        seen.add(key)
        sources.append("\n".join(_lines(where)[node.lineno - 1:node.end_lineno]))  # type: ignore[attr-defined]
        if "seed-parity" in sources[-1]:
            reads_page = True
        named = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        named |= {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
        local, imported = _definitions(where), _test_imports(where)
        for word in named:
            if where == "tests/unit/test_seed_parity.py" and word in PAGE_HELPERS:
                reads_page = True
            elif word in local and local[word] is not node:
                pending.append((where, local[word]))
            elif word in imported:
                other, original = imported[word]
                if other == "tests/unit/test_seed_parity.py" and original in PAGE_HELPERS:
                    reads_page = True
                elif (found := _definitions(other).get(original)) is not None:
                    pending.append((other, found))
            else:
                for conftest in _conftests(where):
                    if (fixture := _definitions(conftest).get(word)) is not None:
                        pending.append((conftest, fixture))
                        break
    return Reach("\n".join(sources), reads_page)


def behaviour_tests(cell: str) -> list[tuple[str, str]]:
    """The (surface, reference) pairs a tests cell names as behaviour tests."""
    return BEHAVIOUR.findall(cell)


def behaviour_problems(surface: str, reference: str) -> list[str]:
    """Why ``reference`` is not a behaviour test through ``surface`` (none: it is one)."""
    path, _, name = reference.partition("::")
    if name not in collected(path):
        return [f"{reference} is not a collected test"]
    reached = reach(reference)
    problems = []
    if not re.search(SURFACES[surface], reached.source):
        problems.append(f"{reference} does not reach the {surface}")
    if reached.reads_page:
        problems.append(f"{reference} reads the parity page")
    if STUB.search(reached.source) and reference not in FAULTS:
        problems.append(f"{reference} replaces product code (a stub) and FAULTS says no why")
    return problems


def awaiting(row: Row) -> bool:
    return row.behaviour.startswith(AWAITING)


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
    for row in table_rows(TABLE.read_text()):
        verdict = row.verdict
        if verdict is None:
            problems.append(f"L{row.line} {row.behaviour[:60]}: parity {row.parity[:40]!r}")
        elif verdict != "same" and len(row.parity) < len(verdict) + 20:
            problems.append(f"L{row.line} {row.behaviour[:60]}: a {verdict} without its reason")
    assert problems == []


def test_a_same_row_states_no_difference() -> None:
    """"same" means the document's behaviour as it states it; a row whose own text says
    where Sluice differs is a difference, and leads with it."""
    wrong = [f"L{row.line} {row.behaviour[:60]}" for row in table_rows(TABLE.read_text())
             if row.verdict == "same"
             and re.search(r"\bdiffer(ence|s)?\b", row.parity)]
    assert wrong == []


def test_every_same_row_names_a_behaviour_test_through_the_product() -> None:
    problems = []
    for row in table_rows(TABLE.read_text()):
        if row.verdict != "same" or awaiting(row):
            continue
        named = behaviour_tests(row.tests)
        if not named:
            problems.append(f"L{row.line} {row.behaviour[:60]}: no behaviour test")
        problems += [f"L{row.line}: {why}" for surface, reference in named
                     for why in behaviour_problems(surface, reference)]
    assert problems == []


def test_no_same_row_names_a_test_that_stubs_the_product() -> None:
    """A supporting test of a "same" row is no stub either, unless ``FAULTS`` says why."""
    stubs = [f"L{row.line}: {reference}" for row in table_rows(TABLE.read_text())
             if row.verdict == "same" and not awaiting(row)
             for reference in REFERENCE.findall(row.tests)
             if STUB.search(reach(reference).source) and reference not in FAULTS]
    assert stubs == []


def test_no_row_names_a_test_that_reads_the_page() -> None:
    readers = [f"L{row.line}: {reference}" for row in table_rows(TABLE.read_text())
               for reference in REFERENCE.findall(row.tests)
               if reach(reference).reads_page]
    assert readers == []


def test_awaiting_and_faults_name_what_is_there() -> None:
    for start in AWAITING:
        [found] = [r for r in table_rows(TABLE.read_text()) if r.behaviour.startswith(start)]
        assert found.verdict == "same" and not behaviour_tests(found.tests), start
    named = {reference for row in table_rows(TABLE.read_text())
             for reference in REFERENCE.findall(row.tests)}
    assert set(FAULTS) <= named


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
    assert behaviour_tests(f"route: `{this}::test_a`, `{this}::test_b`; job: `{this}::t`") == [
        ("route", f"{this}::test_a"), ("job", f"{this}::t")]


def test_the_behaviour_check_itself() -> None:
    """The check tells a behaviour test from a test that reads the page or stubs the code."""
    http = "tests/e2e/http/test_http.py::test_admin_post"
    assert behaviour_problems("route", http) == []
    assert behaviour_problems("job", http) == [f"{http} does not reach the job"]
    reads = "tests/unit/test_seed_parity.py::test_the_row_count_the_page_states_is_the_tables"
    assert reach(reads).reads_page
    # a stub a conftest applies without the test naming it is the test's own; a module
    # that overrides the fixture has none
    recorded = "tests/integration/delivery/test_isolation.py::test_a_preview_counts_entries_no_drain_has_taken"
    assert behaviour_problems("job", recorded) == [
        f"{recorded} replaces product code (a stub) and FAULTS says no why"]
    real = ("tests/integration/delivery/test_parity_delivery.py::"
            "test_a_redrive_of_an_entry_its_destinations_410_failed_is_sent_by_the_next_run")
    assert behaviour_problems("job", real) == []
    stub = "tests/e2e/queues/test_consumers_lambda.py::test_ingest_acknowledges_without_work_when_the_flag_is_off"
    assert behaviour_problems("handler", stub) == [
        f"{stub} replaces product code (a stub) and FAULTS says no why"]
    assert not reach(http).reads_page


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


# --- the numbers the differences state against the code -----------------------------------
# A difference's number is Sluice's (its where and parity cells) and must be the code's; a
# consistency check of the page, which no row names as its evidence (a "same" row's number
# is shown by its behaviour test).


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


def test_the_numbers_sluice_states_in_differences_are_the_codes() -> None:
    from sluice.billing.metering import DEFAULT_FLUSH_LIMIT
    from sluice.core.settings import Settings
    from sluice.delivery.classify import PERMANENT_PATTERNS
    from sluice.delivery.policy import DEFAULT_SCHEDULE
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


def test_the_job_count_is_the_registrys() -> None:
    from sluice.jobs.registry import JOBS

    words = {"five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}
    seed_count = words[numbers_word(row("Five cron jobs")[0])]
    sluice_count = words[numbers_word(row("Five cron jobs")[2].removeprefix("addition: "))]
    assert seed_count == 5 and sluice_count == len(JOBS.using(()))


def numbers_word(cell: str) -> str:
    return cell.split()[0].strip(";,:").lower()


# --- facts of rows whose tests elsewhere do not show them --------------------------------


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


