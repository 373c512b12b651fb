"""The mutant catalog (``catalog.toml``), read and checked.

A mutant is one textual edit of one product file under ``shared/sluice/``: ``find`` must
occur there exactly once (so the catalog cannot rot silently when the code moves: a test
checks every entry), and the edit never touches ``bench/`` (the simulator is the judge).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
CATALOG = Path(__file__).with_name("catalog.toml")
PRODUCT = "shared/sluice/"
FIELDS = ("id", "file", "find", "replace", "breaks")


class Mutant(NamedTuple):
    id: str
    file: str  # relative to the tree's root, under shared/sluice/
    find: str
    replace: str
    breaks: str  # the defect, in words

    def apply(self, root: Path) -> None:
        """Edit ``root``'s copy of the file (never the real checkout's: ``root`` is a copy)."""
        path = root / self.file
        text = path.read_text()
        problem = self.problem(text)
        if problem:
            raise ValueError(f"mutant {self.id}: {problem}")
        path.write_text(text.replace(self.find, self.replace, 1))

    def problem(self, text: str) -> str | None:
        """Why this mutant cannot be applied to ``text`` (None: it can)."""
        found = text.count(self.find)
        if found != 1:
            return f"its find text occurs {found} times in {self.file} (exactly once wanted)"
        return None


class CatalogError(ValueError):
    pass


def load(path: Path = CATALOG) -> list[Mutant]:
    """Every mutant of the catalog, checked for form (not against the tree: ``check``)."""
    data = tomllib.loads(path.read_text())
    unknown = set(data) - {"mutant"}
    if unknown:
        raise CatalogError(f"{path.name}: unknown top-level keys {sorted(unknown)}")
    mutants: list[Mutant] = []
    seen: set[str] = set()
    for n, entry in enumerate(data.get("mutant", []), 1):
        # only the replacement may be empty (a deletion)
        missing = [name for name in FIELDS if not isinstance(entry.get(name), str)
                   or (name != "replace" and not entry[name].strip())]
        extra = sorted(set(entry) - set(FIELDS))
        if missing or extra:
            raise CatalogError(f"{path.name}: mutant #{n}: missing or empty {missing}, "
                               f"unknown {extra}")
        mutant = Mutant(**{name: entry[name] for name in FIELDS})
        if mutant.id in seen:
            raise CatalogError(f"{path.name}: mutant id {mutant.id!r} appears twice")
        if not mutant.file.startswith(PRODUCT) or ".." in Path(mutant.file).parts:
            raise CatalogError(f"{path.name}: {mutant.id}: {mutant.file} is not product code "
                               f"under {PRODUCT}")
        if mutant.find == mutant.replace:
            raise CatalogError(f"{path.name}: {mutant.id}: its replacement changes nothing")
        seen.add(mutant.id)
        mutants.append(mutant)
    return mutants


def check(mutants: list[Mutant], root: Path = ROOT) -> list[str]:
    """The problems of applying each mutant to the tree at ``root`` (empty: none)."""
    problems = []
    for mutant in mutants:
        path = root / mutant.file
        if not path.is_file():
            problems.append(f"{mutant.id}: no file {mutant.file}")
            continue
        problem = mutant.problem(path.read_text())
        if problem:
            problems.append(f"{mutant.id}: {problem}")
    return problems
