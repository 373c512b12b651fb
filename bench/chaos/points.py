"""Every named crash point in ``shared/``, found by reading the source.

A point is the literal argument of a ``crash_point("...")`` call; where a function
passes its ``point`` parameter on (``crash_point(point)``), the literals given as
``point="..."`` in that module are the points.
"""

from __future__ import annotations

import ast
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "sluice"
CRASH_MODULE = SHARED / "core" / "crash.py"


def _is_crash_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "crash_point") or (
        isinstance(func, ast.Attribute) and func.attr == "crash_point")


def points_in(source: str, filename: str = "<source>") -> set[str]:
    tree = ast.parse(source, filename)
    found: set[str] = set()
    forwarded: set[str] = set()
    for node in ast.walk(tree):
        if not _is_crash_call(node):
            continue
        assert isinstance(node, ast.Call)
        if not node.args:
            raise ValueError(f"{filename}:{node.lineno}: crash_point() without a name")
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            found.add(arg.value)
        elif isinstance(arg, ast.Name):
            forwarded.add(arg.id)
        else:
            raise ValueError(f"{filename}:{node.lineno}: crash point name is not readable")  # noqa: TRY004
    if forwarded:
        given = {kw.value.value for node in ast.walk(tree) if isinstance(node, ast.Call)
                 for kw in node.keywords
                 if kw.arg in forwarded and isinstance(kw.value, ast.Constant)
                 and isinstance(kw.value.value, str)}
        if not given:
            raise ValueError(f"{filename}: crash_point({', '.join(sorted(forwarded))}) "
                             "is passed no literal name in this module")
        found |= given
    return found


def discover(root: Path = SHARED) -> list[str]:
    """Sorted names of every crash point under ``root``."""
    names: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        if path == CRASH_MODULE:
            continue
        source = path.read_text()
        if "crash_point" in source:
            names |= points_in(source, str(path))
    return sorted(names)
