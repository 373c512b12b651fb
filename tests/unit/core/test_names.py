"""Names say what a thing is: no two classes in ``shared`` share a name (two different
``Outcome`` enums, for one, would read alike at every call site); a Protocol may share the
name of the class that implements it."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SHARED = Path(__file__).resolve().parents[3] / "shared" / "sluice"


def _is_protocol(node: ast.ClassDef) -> bool:
    """A Protocol names the shape its one implementation has, under the same name."""
    return any(getattr(base, "id", getattr(base, "attr", None)) == "Protocol"
               for base in node.bases)


def test_every_class_name_in_shared_is_unique() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(SHARED.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not _is_protocol(node):
                where[node.name].append(str(path.relative_to(SHARED)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def test_the_outcome_enums_name_what_they_describe() -> None:
    from sluice.delivery.drain import SendOutcome
    from sluice.queues.consumer import MessageOutcome

    assert SendOutcome.ACKED.value == "acked" and MessageOutcome.DONE.value == "done"
