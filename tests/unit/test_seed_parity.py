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
    assert "(status, next_attempt_at)" in sql
    assert "WHERE status IN ('pending', 'in_flight')" in sql
