"""``python -m bench peers [--n N] [--workers W] [--batch B] [--side S ...] [--store ST ...]
[--n-for SIDE=N ...] [--json]``: Sluice's durable queue side by side with the peers.

First the machine's own commit rate (``bench.peers.limit``), then on each store every
side that has it, Sluice first, each in a process of its own on a fresh database: N jobs
enqueued one call at a time, all N processed to completion by W workers, then N more
enqueued in batches of B where the side's API has a batch call. One table a store: the
rates, p50/p99 enqueue-to-completion, and Sluice's ratio against each peer (above 1:
Sluice better), with Sluice's processed/s as a fraction of the machine's commits/s.
``--json`` prints the rows as ``python -m bench --json`` does (the table goes to stderr).
A side whose package is not installed, or that fails, is shown so and the exit status
is 1; Oban for Python needs Python 3.12 or newer, and on an older interpreter its row
says so without failing the run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from bench.common import Row, row
from bench.peers import limit
from bench.peers.child import SIDES
from bench.peers.common import STORES, fresh_postgres

ROOT = Path(__file__).resolve().parents[2]
# the import names each side needs; Oban for Python's package needs Python 3.12
NEEDS = {"sluice": ("sluice",), "pgqueuer": ("pgqueuer", "asyncpg"),
         "procrastinate": ("procrastinate",), "oban": ("oban",), "dbos": ("dbos",),
         "huey": ("huey",), "persist-queue": ("persistqueue",)}
NEEDS_PYTHON = {"oban": (3, 12)}
STORE_NAMES = {"postgres": "Postgres", "sqlite": "SQLite"}
COLUMNS = ("side", "n", "enqueue/s", "batch enqueue/s", "processed/s", "p50 ms", "p99 ms",
           "Sluice processed x", "Sluice enqueue x", "Sluice p50 x")


def _missing(side: str, store: str) -> str | None:
    """Why ``side`` cannot run on ``store`` in this interpreter (None: it can)."""
    if (side, store) == ("dbos", "sqlite") and sys.version_info >= (3, 12) \
            and sqlite3.sqlite_version_info < (3, 42):
        # DBOS's SQLite schema on Python 3.12+ stamps rows with unixepoch('subsec')
        return (f"not measured: DBOS on Python 3.12+ needs SQLite 3.42+, this interpreter "
                f"has {sqlite3.sqlite_version}")
    wanted = NEEDS_PYTHON.get(side)
    if wanted is not None and sys.version_info < wanted:
        return (f"not measured: {side} needs Python {wanted[0]}.{wanted[1]}+, this is "
                f"{sys.version_info.major}.{sys.version_info.minor}")
    absent = [name for name in NEEDS[side] if importlib.util.find_spec(name) is None]
    return f"not installed: {', '.join(absent)} (pip install -e '.[bench]')" if absent else None


def _child_env() -> dict[str, str]:
    """The parent's environment less any Sluice setting (the sides set their own); the
    services' addresses (``SLUICE_TEST_*``) pass."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("SLUICE_") or k.startswith("SLUICE_TEST_")}


def run_side(side: str, store: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """One side's figures, from its own process on a fresh database (or its error)."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("SLUICE_BENCH_TMP")) as tmp:
        out = f"{tmp}/figures.json"

        def child(target: str) -> dict[str, Any]:
            command = [sys.executable, "-m", "bench.peers.child", side, store, target, out,
                       "--n", str(n), "--workers", str(args.workers),
                       "--batch", str(args.batch), "--timeout", str(args.timeout)]
            done = subprocess.run(command, cwd=ROOT, env=_child_env(), capture_output=True,
                                  text=True, timeout=args.timeout * 3, check=False)
            if done.returncode != 0:
                return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1],
                        "stderr": done.stderr[-4000:]}
            figures: dict[str, Any] = json.loads(Path(out).read_text())
            return figures

        if store == "sqlite":
            return child(tmp)
        with fresh_postgres(side) as url:
            return child(url)


def _ratio(ours: float | None, theirs: float | None, higher_is_better: bool) -> float | None:
    if not ours or not theirs:
        return None
    return ours / theirs if higher_is_better else theirs / ours


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def table(store: str, results: dict[str, dict[str, Any]], machine: limit.Limit, n: int,
          workers: int, out: TextIO) -> list[Row]:
    """Print the store's side-by-side table; the rows (``bench.common.Row``) it gives."""
    ours = results.get("sluice", {})
    lines = [COLUMNS]
    rows: list[Row] = []
    for side, got in results.items():
        if "error" in got or "skipped" in got:
            lines.append((side, "", got.get("skipped") or f"FAILED: {got['error']}", *[""] * 7))
            continue
        ratios = (_ratio(ours.get("processedPerS"), got["processedPerS"], True),
                  _ratio(ours.get("enqueuePerS"), got["enqueuePerS"], True),
                  _ratio(ours.get("p50Ms"), got["p50Ms"], False))
        lines.append((side, _fmt(got["n"]), _fmt(got["enqueuePerS"]), _fmt(got["batchPerS"]),
                      _fmt(got["processedPerS"]), _fmt(got["p50Ms"]), _fmt(got["p99Ms"]),
                      *("" if side == "sluice" else _fmt(r, 2) + "x" if r else "-"
                        for r in ratios)))
        if side == "sluice" or not ours.get("processedPerS"):
            continue
        where = f"{STORE_NAMES[store]} vs {side}"
        rows += [row(f"peers: processed/s, {where}", ours["processedPerS"], got["processedPerS"],
                     "jobs/s", True, note=f"n={got['n']}, {workers} workers"),
                 row(f"peers: enqueue/s one call a job, {where}", ours["enqueuePerS"],
                     got["enqueuePerS"], "jobs/s", True),
                 row(f"peers: p50 enqueue to completion, {where}", ours["p50Ms"], got["p50Ms"],
                     "ms", False),
                 row(f"peers: p99 enqueue to completion, {where}", ours["p99Ms"], got["p99Ms"],
                     "ms", False)]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(COLUMNS))]
    print(f"\n{STORE_NAMES[store]}: n={n}, {workers} workers; the machine: one-row INSERT "
          f"commits/s {machine.one:,.0f} (1 connection), {machine.many:,.0f} "
          f"({machine.connections} at once); {machine.durability}", file=out)
    for i, line in enumerate(lines):
        print("  ".join(str(cell).ljust(w) for cell, w in zip(line, widths, strict=True))
              .rstrip(), file=out)
        if i == 0:
            print("  ".join("-" * w for w in widths), file=out)
    if ours.get("processedPerS"):
        fraction = ours["processedPerS"] / machine.best
        print(f"Sluice processed/s = {fraction:.1%} of the machine's best one-row commits/s "
              f"({machine.best:,.0f})", file=out)
        rows.append(row(f"peers: Sluice processed/s vs the machine's commits/s, "
                        f"{STORE_NAMES[store]}", ours["processedPerS"], machine.best,
                        "jobs/s", True, note=machine.durability))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench peers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20_000, help="jobs per side (default 20000)")
    parser.add_argument("--workers", type=int, default=4, help="workers per side (default 4)")
    parser.add_argument("--batch", type=int, default=100,
                        help="batch size of the batch-enqueue row (default 100)")
    parser.add_argument("--side", action="append", choices=sorted(SIDES),
                        help="only this side (repeatable; Sluice always runs)")
    parser.add_argument("--store", action="append", choices=STORES,
                        help="only this store (repeatable; default both)")
    parser.add_argument("--n-for", action="append", default=[], metavar="SIDE=N",
                        help="a different N for one side (its row says so)")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds a side may take for each phase (default 1800)")
    parser.add_argument("--json", action="store_true", help="the rows as JSON on stdout")
    args = parser.parse_args(argv)
    if args.n < 1 or args.workers < 1 or args.batch < 1:
        parser.error("--n, --workers and --batch must be at least 1")
    per_side: dict[str, int] = {}
    for item in args.n_for:
        side, _, count = item.partition("=")
        if side not in SIDES or not count.isdigit() or int(count) < 1:
            parser.error(f"--n-for wants SIDE=N with a known side, got {item!r}")
        per_side[side] = int(count)
    chosen = ["sluice", *sorted(set(args.side or SIDES) - {"sluice"})]
    out = sys.stderr if args.json else sys.stdout
    rows: list[Row] = []
    failed = False
    for store in args.store or STORES:
        if store == "postgres":
            machine = limit.postgres(args.workers)
        else:
            with tempfile.TemporaryDirectory(dir=os.environ.get("SLUICE_BENCH_TMP")) as tmp:
                machine = limit.sqlite(tmp)
        results: dict[str, dict[str, Any]] = {}
        for side in chosen:
            if store not in SIDES[side][1]:
                continue
            n = per_side.get(side, args.n)
            why = _missing(side, store)
            if why is not None:
                results[side] = {"skipped": why}
                failed = failed or why.startswith("not installed")
            else:
                print(f"bench peers: {side} on {store}, n={n} ...", file=sys.stderr, flush=True)
                results[side] = run_side(side, store, n, args) | {"n": n}
                if "error" in results[side]:
                    failed = True
                    print(results[side]["stderr"], file=sys.stderr)
        rows += table(store, results, machine, args.n, args.workers, out)
    if args.json:
        from bench.__main__ import as_json

        print(json.dumps(as_json(rows), indent=1, allow_nan=False))
    return 1 if failed else 0
