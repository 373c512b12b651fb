"""``python -m bench [name ...]``: run benchmark modules and print one table.

With no names, every known module runs. A module that fails to import or run
prints its error and the runner carries on; the exit code is non-zero at the end.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import Any

MODULES = ("cleanup", "redrive", "metering", "erasure", "queues", "coldstart", "rss")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_rows(rows: list[dict[str, Any]]) -> None:
    header = ("benchmark", "sluice", "baseline", "unit", "ratio", "note")
    table = [header] + [
        (str(r["name"]), _fmt(r["sluice"]), _fmt(r["baseline"]), str(r["unit"]),
         f"{r['ratio']:.2f}x", str(r.get("note", "")))
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for n, line in enumerate(table):
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * width for width in widths))


def main(argv: list[str] | None = None) -> int:
    names = list(argv if argv is not None else sys.argv[1:]) or list(MODULES)
    if names[0] == "chaos":  # the reliability sweep prints its own table
        from bench.chaos.main import main as chaos

        return chaos(names[1:])
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    for name in names:
        try:
            module = importlib.import_module(f"bench.{name}")
            produced = module.run()
        except Exception:  # noqa: BLE001 - one broken benchmark must not hide the others
            print(f"bench {name}: FAILED", file=sys.stderr)
            traceback.print_exc()
            failed.append(name)
            continue
        rows.extend(produced)
        print(f"bench {name}: {len(produced)} row(s)", file=sys.stderr)
    if rows:
        print_rows(rows)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
