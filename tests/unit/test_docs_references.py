"""The docs name only what exists: every file path and module of the project, and every
``sluice …`` command with its options, named in docs/ and README.md."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

from sluice.cli.main import build_parser
from tests.conftest import ROOT

PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
TOPS = ("shared", "functions", "bench", "infra", "tests")
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOPS) + r")/[\w.*/-]*[\w*/])")
MODULE = re.compile(r"(?<![\w./-])((?:shared|functions|bench)(?:\.\w+)+)(?::(\w+))?")
CODE = re.compile(r"`([^`\n]+)`")


def _pages() -> list[tuple[str, str]]:
    return [(page.relative_to(ROOT).as_posix(), page.read_text()) for page in PAGES]


def test_every_named_path_exists() -> None:
    missing = []
    for name, text in _pages():
        for path in {m.group(1).rstrip("/.") for m in PATH.finditer(text)}:
            if "*" in path or "…" in path:
                found = any(ROOT.glob(path.replace("…", "*")))
            else:  # functions/cron.handler: a handler in serverless.yml's notation
                found = (ROOT / path).exists() or (ROOT / re.sub(r"\.\w+$", ".py", path)).exists()
            if not found:
                missing.append(f"{name}: {path}")
    assert missing == []


def _resolves(dotted: str, attribute: str | None) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            continue
        target: object = importlib.import_module(module)
        for attr in [*parts[cut:], *([attribute] if attribute else [])]:
            if not hasattr(target, attr):
                return False
            target = getattr(target, attr)
        return True
    return False


def test_every_named_module_exists() -> None:
    missing = [f"{name}: {m.group(0)}" for name, text in _pages()
               for m in MODULE.finditer(text)
               if not m.group(1).endswith((".py", ".md")) and not _resolves(m.group(1), m.group(2))]
    assert missing == []


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def check_command(span: str, root: argparse.ArgumentParser) -> str | None:
    """Why ``span`` (``sluice …`` as a page writes it) names no command, or None."""
    tokens = span.split()[1:]
    parser, path = root, ["sluice"]
    leading = []
    while tokens and tokens[0].startswith("-"):  # sluice -v run …
        leading.append(tokens.pop(0))
    while tokens and not tokens[0].startswith("-"):
        children = _subcommands(parser)
        if not children:
            break
        word = tokens.pop(0)
        if word not in children:
            return f"{' '.join(path)} has no command {word!r}"
        parser, path = children[word], [*path, word]
    known = _options(parser) | _options(root)
    for option in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", " ".join([*leading, *tokens])):
        if option not in known:
            return f"{' '.join(path)} has no option {option}"
    return None


def test_every_named_command_and_option_exists() -> None:
    root = build_parser()
    wrong = []
    for name, text in _pages():
        for span in CODE.findall(text):
            if re.match(r"sluice(\s|$)", span) and (why := check_command(span, root)):
                wrong.append(f"{name}: `{span}`: {why}")
    assert wrong == []


def test_docs_cli_lists_every_command() -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    from sluice.cli.main import leaf_commands

    for command in leaf_commands(build_parser()):
        spelled = r"\s".join(map(re.escape, command))
        assert re.search(rf"sluice {spelled}\b", text) or \
            re.search(rf"`{re.escape(command[-1])}\b", text), command


@pytest.mark.parametrize(("span", "why"), [
    ("sluice dlq list --limit 5", None),
    ("sluice dlq frob", "sluice dlq has no command 'frob'"),
    ("sluice delivery list --nope", "sluice delivery list has no option --nope"),
    ("sluice -v run JOB --json", None),
])
def test_the_command_check_itself(span: str, why: str | None) -> None:
    assert check_command(span, build_parser()) == why


def test_the_path_pattern_itself() -> None:
    found = [m.group(1) for m in PATH.finditer(
        "see `shared/sluice/delivery/channels.py`, infra/*.yml and (tests/providers/).")]
    assert found == ["shared/sluice/delivery/channels.py", "infra/*.yml", "tests/providers/"]
    assert not (ROOT / "shared/sluice/delivery/channels.py").exists()
    assert Path(ROOT / "shared/sluice/delivery/channels").is_dir()


TEST = re.compile(r"(?<![\w./-])(tests/[\w/]+\.py)::(\w+(?:::\w+)?)")


def test_every_named_test_exists() -> None:
    """A claim that names its test names one pytest collects (``path.py::test`` or
    ``path.py::Class::test``; a parametrised case is named by its function)."""
    from tests.unit.test_seed_parity import collected

    missing = sorted({f"{name}: {m.group(1)}::{m.group(2)}" for name, text in _pages()
                      for m in TEST.finditer(text) if m.group(2) not in collected(m.group(1))})
    assert missing == []


def test_the_test_check_itself() -> None:
    from tests.unit.test_seed_parity import collected

    text = ("`tests/unit/test_docs_references.py::test_every_named_test_exists`, "
            "tests/unit/test_docs_references.py::test_no_such_test")
    named = [(m.group(1), m.group(2)) for m in TEST.finditer(text)]
    assert named == [("tests/unit/test_docs_references.py", "test_every_named_test_exists"),
                     ("tests/unit/test_docs_references.py", "test_no_such_test")]
    assert [n in collected(p) for p, n in named] == [True, False]


LINK = re.compile(r"\]\(([^)\s]+)\)")
# The front page and the pages that point readers at it and at the record of past runs.
LINKED = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "docs" / "README.md",
          ROOT / "docs" / "reliability.md", ROOT / "docs" / "cli.md",
          ROOT / "docs" / "contributing.md", *sorted((ROOT / "docs" / "history").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped, spaces
    as hyphens); headings inside code blocks are not headings."""
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (heading := re.match(r"#+ (.+)", line)):
            found.add(re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-"))
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no such heading")
    return broken


@pytest.mark.parametrize("page", LINKED, ids=[p.relative_to(ROOT).as_posix() for p in LINKED])
def test_every_link_and_anchor_of_the_front_page_and_its_record_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_check_itself(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# What it `guarantees`: today\n```\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#what-it-guarantees-today) [gone](c.md) "
                    "[code](a.md#not-a-heading) [web](https://example.com/x#y)")
    assert broken_links(page) == ["c.md: no such file", "a.md#not-a-heading: no such heading"]
