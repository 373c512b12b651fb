"""``python -m bench simulate [--seed N | --seeds K [--first F]] [--days D] [--inject NAME]``

Runs each seed's simulation (see ``bench/simulate/__init__.py``), prints one row per seed
and a total, and exits 1 when any invariant was violated. A failing seed prints the
invariant, the simulated day, the steps that led there and the command that replays it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.simulate.clock import SimClock
from bench.simulate.rogue import INJECTIONS


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench simulate")
    parser.add_argument("--seed", type=int, action="append",
                        help="run this seed (repeat for several)")
    parser.add_argument("--seeds", type=int, default=5, help="how many seeds (default 5)")
    parser.add_argument("--first", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--days", type=int, default=30, help="simulated days (default 30)")
    parser.add_argument("--quiet", action="store_true", help="only the table")
    parser.add_argument("--keep-going", action="store_true",
                        help="count every violation instead of stopping a seed at its first")
    parser.add_argument("--inject", choices=INJECTIONS,
                        help="switch on a known defect, to see the invariants catch it")
    return parser.parse_args(argv)


def _faults(faults: dict[str, int]) -> str:
    return " ".join(f"{kind}={count}" for kind, count in sorted(faults.items()) if count)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _scratch() -> str | None:
    """A memory-backed directory when there is one: the database's commits then cost no
    disk flush, and simulated time costs only the work."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


class _Discard(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


def run_seed(seed: int, days: int, clock: SimClock, inject: str | None = None,
             keep_going: bool = False) -> Any:
    from bench.simulate.engine import Simulation

    clock.reset()
    with tempfile.TemporaryDirectory(prefix=f"sluice-sim-{seed}-", dir=_scratch()) as directory, \
            contextlib.redirect_stdout(_Discard()), \
            contextlib.redirect_stderr(_Discard()):  # the metrics' EMF lines, the logs
        return Simulation(seed, days, Path(directory), clock, inject, keep_going).run()


def _fixed_hashes(argv: list[str]) -> None:
    """Re-run this command with ``PYTHONHASHSEED=0``: set iteration order (ids in Sluice's
    sets) would otherwise differ between processes, and with it the order of effects."""
    if os.environ.get("PYTHONHASHSEED") != "0":
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, "-m", "bench", "simulate", *argv],
                  os.environ | {"PYTHONHASHSEED": "0"})


def main(argv: list[str] | None = None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    _fixed_hashes(argv)
    args = _parse(argv)
    clock = SimClock()
    clock.install()  # before Sluice is imported: it binds time.monotonic at import
    logging.getLogger("sluice").setLevel(logging.CRITICAL)
    from shared.core.observe import logger

    logger.setLevel(logging.CRITICAL)
    seeds = args.seed if args.seed else list(range(args.first,
                                                                 args.first + args.seeds))
    header = ["seed", "days", "steps", "runs", "faults", "deliveries", "violations",
              "digest", "wall s"]
    rows = [header]
    totals: dict[str, int] = {}
    failed = []
    steps = runs = deliveries = 0
    started = time.perf_counter()
    try:
        for seed in seeds:
            out = run_seed(seed, args.days, clock, args.inject, args.keep_going)
            rows.append([str(seed), str(args.days), str(out.steps), str(out.runs),
                         _faults(out.faults), str(out.deliveries), str(len(out.violations)),
                         out.digest, f"{out.wall_s:.1f}"])
            steps, runs, deliveries = steps + out.steps, runs + out.runs, deliveries + out.deliveries
            for kind, count in out.faults.items():
                totals[kind] = totals.get(kind, 0) + count
            if out.violations:
                failed.append(out)
            if not args.quiet:
                print(" ".join(rows[-1]), file=sys.stderr, flush=True)
    finally:
        clock.uninstall()
    wall = time.perf_counter() - started
    rows.append([f"{len(seeds)} seeds", str(args.days * len(seeds)), str(steps), str(runs),
                 _faults(totals), str(deliveries), str(sum(len(o.violations) for o in failed)),
                 "", f"{wall:.1f}"])
    print(_table(rows))
    for out in failed:
        first = out.violations[0]
        print(f"\nseed {out.seed}: VIOLATION {first.invariant} on day {first.day:.2f} "
              f"({first.at:%Y-%m-%d %H:%M:%S}): {first.detail}")
        print("the steps that led there:")
        for line in out.trail:
            print(f"  {line}")
        inject = f" --inject {args.inject}" if args.inject else ""
        print(f"replay: python -m bench simulate --seed {out.seed} --days {out.days}{inject}")
    return 1 if failed else 0
