"""The README's test command is tests/run, .ci/run runs exactly it, and it does the set-up a
fresh machine needs (services, Chromium) before it installs, lints and tests."""

from __future__ import annotations

import os
import re

from tests.conftest import ROOT


def _commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.DOTALL)
    assert block is not None and readme.index(block.group(0)) < readme.index("\n\n", 10)
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_the_readme_opens_with_the_two_quick_start_commands() -> None:
    start, test = _commands()
    assert start.endswith(".venv/bin/sluice dev")
    assert test == "tests/run"
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == f"exec {test}"
    assert os.access(ROOT / "tests" / "run", os.X_OK) and os.access(ROOT / ".ci" / "run", os.X_OK)


def test_the_test_command_sets_up_then_lints_then_tests() -> None:
    steps = [line.strip() for line in (ROOT / "tests" / "run").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    text = "\n".join(steps)
    for needed in ("answers 5432", "pg_ctlcluster", "answers 6379", "redis-server --daemonize",
                   "command -v chromium", "apt-get install -y -q chromium"):
        assert needed in text, needed
    tail = steps[-7:]
    assert tail == ["python3 -m venv .venv",
                    ".venv/bin/pip uninstall -y -q sluice >/dev/null 2>&1 || true",
                    ".venv/bin/pip install -q -e '.[dev]'",
                    ".venv/bin/ruff check .", ".venv/bin/lint-imports", ".venv/bin/mypy",
                    '.venv/bin/python -m pytest -n 2 "$@"']
    assert text.index("chromium") < text.index("python3 -m venv .venv")
