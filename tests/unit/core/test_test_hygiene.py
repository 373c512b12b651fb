"""Tests mint admin tokens when they run, never at import (a token minted at import
expires while a slow suite is still running)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
MINTERS = frozenset({"admin_token", "jwt.encode", "mint"})


def _module_level_calls(tree: ast.Module) -> list[ast.Call]:
    """Calls evaluated at import: outside any function body (lambdas are deferred too)."""
    found: list[ast.Call] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            # Decorators (pytest.mark.parametrize values) and defaults run at import.
            for expr in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
                if expr is not None:
                    visit(expr)
            return
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, ast.Call):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else "?"
        return f"{owner}.{func.attr}"
    return getattr(func, "id", "")


def test_no_test_module_mints_a_token_at_import() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for call in _module_level_calls(tree):
            if _name(call) in MINTERS:
                offenders.append(f"{path.relative_to(TESTS)}:{call.lineno} {_name(call)}()")
    assert offenders == [], "tokens minted at import: " + ", ".join(offenders)


def test_the_scan_finds_a_token_minted_at_import() -> None:
    sample = ast.parse('HEADERS = {"a": admin_token(["ops"])}\n'
                       '@pytest.mark.parametrize("t", [admin_token(["x"])])\n'
                       'def test_x(t): admin_token(["fine"])\n'
                       'LATER = lambda: admin_token(["fine"])\n'
                       'RAW = "secret".encode()\n'
                       'SIGNED = jwt.encode({}, "k")\n')
    assert [c.lineno for c in _module_level_calls(sample) if _name(c) in MINTERS] == [1, 2, 6]
