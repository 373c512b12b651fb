"""Only sluice.egress imports an HTTP or SMTP client library. import-linter's forbidden
contract covers httpx, httpcore, smtplib and http; it can only forbid whole external
packages, so urllib.request (urllib.parse is used everywhere) is checked here."""

from __future__ import annotations

import ast
from pathlib import Path

import sluice

ROOT = Path(sluice.__file__).parent


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_module_outside_the_egress_layer_imports_urllib_request() -> None:
    offenders = sorted(
        str(path.relative_to(ROOT)) for path in ROOT.rglob("*.py")
        if "egress" not in path.relative_to(ROOT).parts
        and any(name == "urllib.request" or name.startswith("urllib.request.")
                for name in _imports(path)))
    assert offenders == []


def test_the_check_sees_an_import_of_urllib_request(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from urllib import request\nimport urllib.request as r\n")
    assert {"urllib.request"} <= _imports(sample)
