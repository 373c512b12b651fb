"""``--coverage``'s table: coverage.py's report summed per package of ``sluice``."""

from __future__ import annotations

from bench.simulate.reach import PACKAGE, per_package, table


def _file(statements: int, covered: int, branches: int, taken: int) -> dict[str, object]:
    return {"summary": {"num_statements": statements, "covered_lines": covered,
                        "num_branches": branches, "covered_branches": taken}}


def test_files_are_summed_per_package_and_a_top_module_counts_as_sluice() -> None:
    rows = per_package({
        str(PACKAGE / "delivery" / "drain.py"): _file(100, 80, 20, 10),
        str(PACKAGE / "delivery" / "channels" / "webhook.py"): _file(50, 10, 10, 0),
        str(PACKAGE / "rss" / "tick.py"): _file(10, 0, 0, 0),
        str(PACKAGE / "extend.py"): _file(4, 4, 2, 1),
    })
    assert [(r.package, r.files, r.statements, r.covered, r.branches, r.covered_branches)
            for r in rows] == [("sluice", 1, 4, 4, 2, 1), ("sluice.delivery", 2, 150, 90, 30, 10),
                               ("sluice.rss", 1, 10, 0, 0, 0)]
    assert rows[1].lines_pct == 60.0 and round(rows[1].branches_pct, 1) == 33.3
    printed = table(rows)
    assert printed.splitlines()[-1].split() == ["total", "4", "164", "94", "57.3", "32", "11",
                                                "34.4"]
