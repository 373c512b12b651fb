"""``--coverage``'s table: coverage.py's report summed per package of ``sluice``."""

from __future__ import annotations

from pathlib import Path

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


def test_the_policy_rows_a_run_took_are_counted_where_they_are_decided(tmp_path: Path) -> None:
    """Rows decided by ``Policy.decide`` and those done by a statement of their own (a
    mark delivered) are both counted; the rest are listed as never reached."""
    from datetime import timedelta

    from bench.simulate.rows import Rows, unreached
    from sluice.delivery.policy import TABLE, DeliveryOutcome
    from sluice.delivery.store import DeliveryStore
    from sluice.store.db import open_database
    from sluice.store.migrate import migrate

    db = open_database(f"sqlite:///{tmp_path}/rows.db")
    migrate(db)
    store = DeliveryStore(db)
    rows = Rows()
    with rows.installed():
        entry, _ = store.enqueue("telegram", "1001", {"payloads": ["hi"]},
                                 lease=timedelta(minutes=2))
        store.apply(entry, store.policy.decide(DeliveryOutcome.UNKNOWN_RESTS))
        store.mark_delivered(entry.id)
    assert rows.reached[DeliveryOutcome.UNKNOWN_RESTS.value] == 1
    assert rows.reached[DeliveryOutcome.MARK_DELIVERED.value] == 1
    missing = unreached(rows.reached)
    assert DeliveryOutcome.MARK_DELIVERED.value not in missing
    assert len(missing) == len(TABLE) - 2
