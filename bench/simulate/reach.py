"""Which product code the simulated worlds execute (``--coverage``): line and branch
coverage of ``shared/sluice`` under coverage.py, per package.

The measurement starts before Sluice is imported (its module-level lines count), in this
process or in each ``--jobs`` worker (each writes a data file of its own after every
seed: a pool's workers end without running their exit hooks); the files are combined at
the end. Every module of the package is counted, imported or not: code no world imports
is code no world reaches. ``--coverage-data PATH`` keeps the combined data, for
``coverage report`` / ``coverage html --data-file PATH``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any, NamedTuple


def _package() -> Path:
    """Where ``sluice`` is, found without importing it (its import is measured)."""
    spec = importlib.util.find_spec("sluice")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))).resolve()


PACKAGE = _package()
DATA = "sim.coverage"  # each process's file is this name and a suffix of its own


class Reached(NamedTuple):
    """One package's counts: statements and branches, in all and executed."""

    package: str
    files: int
    statements: int
    covered: int
    branches: int
    covered_branches: int

    @property
    def lines_pct(self) -> float:
        return 100.0 * self.covered / self.statements if self.statements else 100.0

    @property
    def branches_pct(self) -> float:
        return 100.0 * self.covered_branches / self.branches if self.branches else 100.0


class Measure:
    """coverage.py over the ``sluice`` package, its data in ``directory``."""

    def __init__(self, directory: Path) -> None:
        import coverage

        self.directory = directory
        self.cov = coverage.Coverage(
            data_file=str(directory / DATA), data_suffix=True, branch=True,
            source=[str(PACKAGE)], config_file=False)

    def start(self) -> None:
        self.cov.start()

    def save(self) -> None:
        """Write what was measured so far (a worker, after each seed)."""
        self.cov.save()

    def stop(self) -> None:
        self.cov.stop()
        self.cov.save()


def combined(directory: Path, keep: Path | None = None) -> list[Reached]:
    """The per-package table of every data file in ``directory`` (combined into ``keep``
    when given, else into a scratch file)."""
    import coverage

    target = directory / DATA  # combine reads the files named after its own data file
    cov = coverage.Coverage(data_file=str(target), branch=True, source=[str(PACKAGE)],
                            config_file=False)
    cov.combine([str(directory)], keep=False)
    cov.save()
    if keep is not None:
        shutil.copyfile(target, keep)
    out = directory / "report.json"
    cov.json_report(outfile=str(out))
    return per_package(json.loads(out.read_text())["files"])


def per_package(files: dict[str, Any]) -> list[Reached]:
    """coverage.py's JSON report's files, summed per package of ``sluice`` (a module at the
    package's top counts as ``sluice``)."""
    sums: dict[str, list[int]] = {}
    for name, data in files.items():
        parts = Path(name).resolve().relative_to(PACKAGE).parts
        package = f"sluice.{parts[0]}" if len(parts) > 1 else "sluice"
        summary = data["summary"]
        row = sums.setdefault(package, [0, 0, 0, 0, 0])
        for i, value in enumerate((1, summary["num_statements"], summary["covered_lines"],
                                   summary["num_branches"], summary["covered_branches"])):
            row[i] += value
    return [Reached(package, *row) for package, row in sorted(sums.items())]


def table(rows: list[Reached]) -> str:
    """The per-package table and its total."""
    total = Reached("total", *(sum(getattr(r, f) for r in rows) for f in Reached._fields[1:]))
    lines = [("package", "files", "lines", "covered", "lines %", "branches", "covered",
              "branches %")]
    for r in [*rows, total]:
        lines.append((r.package, str(r.files), str(r.statements), str(r.covered),
                      f"{r.lines_pct:.1f}", str(r.branches), str(r.covered_branches),
                      f"{r.branches_pct:.1f}"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                     for i, (c, w) in enumerate(zip(line, widths, strict=True)))
           for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    out.insert(len(out) - 1, out[1])
    return "\n".join(out)
