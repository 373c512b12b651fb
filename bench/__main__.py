"""``python -m bench [name ...] [--json]``: run benchmark modules and print one table.

With no names, every known module runs. A module that fails to import or run
prints its error and the runner carries on; the exit code is non-zero at the end.
With ``--json`` the rows are printed to stdout as a JSON list of
``{benchmark, sluice, baseline, unit, ratio}`` (``ratio`` > 1: better than the
baseline), and everything else, the table included, goes to stderr.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import traceback
from typing import Any, TextIO

MODULES = ("delivery", "runner", "metering", "ops", "cost", "cleanup", "redrive", "erasure",
           "queues", "coldstart", "rss", "alerts", "request_path")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_rows(rows: list[dict[str, Any]], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    header = ("benchmark", "sluice", "baseline", "unit", "ratio", "note")
    table = [header] + [
        (str(r["name"]), _fmt(r["sluice"]), _fmt(r["baseline"]), str(r["unit"]),
         f"{r['ratio']:.2f}x", str(r.get("note", "")))
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for n, line in enumerate(table):
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
              .rstrip(), file=out)
        if n == 0:
            print("  ".join("-" * width for width in widths), file=out)


def _finite(value: Any) -> Any:
    """JSON has no infinity: a ratio against a zero baseline (nothing left to do) is null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def as_json(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"benchmark": r["name"], "sluice": _finite(r["sluice"]),
             "baseline": _finite(r["baseline"]), "unit": r["unit"],
             "ratio": _finite(r["ratio"])} for r in rows]


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    if args and args[0] == "chaos":  # the reliability sweep prints its own table
        from bench.chaos.main import main as chaos

        return chaos(args[1:])
    if args and args[0] == "mutate":  # defects put into a copy of the tree, one at a time
        from bench.mutate.main import main as mutate

        return mutate(args[1:])
    if args and args[0] == "peers":  # the queues Python users pick, side by side
        from bench.peers.main import main as peers

        return peers(args[1:])
    if args and args[0] == "simulate":  # months of operation on a simulated clock
        from bench.simulate.main import main as simulate

        return simulate(args[1:])
    want_json = "--json" in args
    names = [a for a in args if a != "--json"] or list(MODULES)
    stdout = None
    python_stdout = sys.stdout
    if want_json:  # logs and metrics the code under test prints must not mix with the JSON
        sys.stdout.flush()
        stdout = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    try:
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
    finally:
        if stdout is not None:
            sys.stdout.flush()
            sys.stdout = python_stdout
            os.dup2(stdout, 1)
            os.close(stdout)
    if rows:
        print_rows(rows, sys.stderr if want_json else sys.stdout)
    if want_json:
        print(json.dumps(as_json(rows), indent=1, allow_nan=False))
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
