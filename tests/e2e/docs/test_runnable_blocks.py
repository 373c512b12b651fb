"""The shell blocks a reader runs are run here, as the reader would: every ```` ```bash run ````
block of a page, in page order, in one bash session (so an ``export`` or a ``TOKEN=`` carries
to the next block), in a fresh directory whose ``.venv`` is this suite's, with no Sluice
setting from the environment (the SQLite database is the directory's own). A
```` ```bash serve ```` block is one command that serves on 127.0.0.1:8787 until stopped
(``sluice dev``): it runs in the background on a free port instead (``--port N``; every
``127.0.0.1:8787`` of the page's blocks means that port), the blocks after it run once
``/api/health`` answers, and it is stopped at the end. A block fails the page when any of
its commands exits non-zero (``set -euo pipefail``). docs/contributing.md says when to
mark a block."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port

BLOCK = re.compile(r"^```bash (run|serve)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
DOC_PORT = "127.0.0.1:8787"


def runnable(text: str) -> list[tuple[str, str]]:
    """A page's runnable blocks, in order: (``run`` or ``serve``, the block's text)."""
    return [(match.group(1), match.group(2)) for match in BLOCK.finditer(text)]


def script(blocks: list[tuple[str, str]], port: int) -> str:
    """The bash script that runs ``blocks`` as a reader would, serving on ``port``."""
    here = f"127.0.0.1:{port}"
    lines = ["set -euo pipefail", "set -x"]
    for kind, text in blocks:
        text = text.replace(DOC_PORT, here)
        if kind == "run":
            lines.append(text)
            continue
        [command] = [line for line in text.splitlines() if line.strip()]
        lines += [f"{command} --port {port} > serve.log 2>&1 &",
                  "server=$!",
                  'trap \'kill "$server"; wait "$server" || true\' EXIT',
                  (f"for _ in $(seq 1 600); do curl -fs http://{here}/api/health > /dev/null "
                   "&& break; kill -0 \"$server\"; sleep 0.1; done"),
                  f"curl -fsS http://{here}/api/health > /dev/null"]
    return "\n".join(lines) + "\n"


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [page for page in pages if runnable(page.read_text())]


PAGES = _pages()


def test_the_readme_tour_is_among_the_pages_run() -> None:
    assert ROOT / "README.md" in PAGES
    kinds = [kind for kind, _ in runnable((ROOT / "README.md").read_text())]
    assert kinds.count("serve") == 1 and kinds.count("run") >= 4, kinds


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_a_pages_runnable_blocks_run(page: Path, tmp_path: Path) -> None:
    (tmp_path / ".venv").symlink_to(sys.prefix)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "CRON_"))}
    done = subprocess.run(["bash", "-c", script(runnable(page.read_text()), free_port())],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540,
                          check=False)
    served = tmp_path / "serve.log"
    assert done.returncode == 0, (f"{page.name}: exit {done.returncode}\n--- stdout\n"
                                  f"{done.stdout}\n--- stderr (commands traced)\n{done.stderr}"
                                  f"\n--- served\n{served.read_text() if served.exists() else ''}")


def test_the_runner_reads_only_marked_blocks_and_fails_a_failing_one(tmp_path: Path) -> None:
    page = ("```bash\nnot run\n```\n\n```bash run\nexport SEEN=1\n```\ntext\n"
            "```bash run\ntest \"$SEEN\" = 1\nfalse\necho never\n```\n")
    blocks = runnable(page)
    assert blocks == [("run", "export SEEN=1\n"), ("run", 'test "$SEEN" = 1\nfalse\necho never\n')]
    done = subprocess.run(["bash", "-c", script(blocks, free_port())], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "never" not in done.stdout and "+ false" in done.stderr
