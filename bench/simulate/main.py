"""``python -m bench simulate [--seed N | --seeds K [--first F]] [--days D] [--jobs J]
[--inject NAME] [--keep-going] [--quiet]``

Runs each seed's simulation (see ``bench/simulate/__init__.py``), prints one row per seed
and a total, and exits 1 when any invariant was violated. A failing seed prints the
invariant, the simulated day, the steps that led there and the command that replays it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import multiprocessing
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
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
    parser.add_argument("--jobs", type=int, default=1,
                        help="seeds run on this many processes (default 1); the table "
                             "stays in seed order")
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
    from shared.jobs import runs

    clock.reset()
    runs._ENDED_UNRELEASED.clear()  # the last seed's run holders: nothing of it carries over
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


def _setup() -> SimClock:
    """The simulated clock, installed before Sluice is imported (it binds
    ``time.monotonic`` at import), and the code under test's logging silenced."""
    clock = SimClock()
    clock.install()
    logging.getLogger("sluice").setLevel(logging.CRITICAL)
    from shared.core.observe import logger

    logger.setLevel(logging.CRITICAL)
    return clock


_WORKER_CLOCK: SimClock | None = None


def _worker_setup() -> None:
    global _WORKER_CLOCK
    _WORKER_CLOCK = _setup()


def _worker_run(task: tuple[int, int, str | None, bool]) -> Any:
    assert _WORKER_CLOCK is not None
    seed, days, inject, keep_going = task
    return run_seed(seed, days, _WORKER_CLOCK, inject, keep_going)


def _outcomes(seeds: list[int], args: argparse.Namespace) -> Iterator[Any]:
    """Each seed's outcome, in seed order: in this process, or on ``--jobs`` processes
    (each with its own clock; a seed's history does not depend on where it ran)."""
    tasks = [(seed, args.days, args.inject, args.keep_going) for seed in seeds]
    if args.jobs <= 1:
        clock = _setup()
        try:
            for task in tasks:
                yield run_seed(task[0], task[1], clock, task[2], task[3])
        finally:
            clock.uninstall()
        return
    # spawned, not forked: each worker installs its clock before it imports Sluice
    context = multiprocessing.get_context("spawn")
    with context.Pool(min(args.jobs, len(tasks)), initializer=_worker_setup) as pool:
        yield from pool.imap(_worker_run, tasks)


def main(argv: list[str] | None = None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    _fixed_hashes(argv)
    args = _parse(argv)
    seeds = args.seed if args.seed else list(range(args.first, args.first + args.seeds))
    header = ["seed", "days", "steps", "runs", "coalesced", "faults", "deliveries",
              "violations", "digest", "wall s"]
    rows = [header]
    totals: dict[str, int] = {}
    failed = []
    steps = runs = coalesced = deliveries = 0
    started = time.perf_counter()
    for out in _outcomes(seeds, args):
        skipped = sum(out.coalesced.values())
        rows.append([str(out.seed), str(args.days), str(out.steps), str(out.runs),
                     str(skipped), _faults(out.faults), str(out.deliveries),
                     str(len(out.violations)), out.digest, f"{out.wall_s:.1f}"])
        steps, runs, deliveries = steps + out.steps, runs + out.runs, deliveries + out.deliveries
        coalesced += skipped
        for kind, count in out.faults.items():
            totals[kind] = totals.get(kind, 0) + count
        if out.violations:
            failed.append(out)
        if not args.quiet:
            print(" ".join(rows[-1]), file=sys.stderr, flush=True)
    wall = time.perf_counter() - started
    rows.append([f"{len(seeds)} seeds", str(args.days * len(seeds)), str(steps), str(runs),
                 str(coalesced), _faults(totals), str(deliveries),
                 str(sum(len(o.violations) for o in failed)), "", f"{wall:.1f}"])
    print(_table(rows))
    for out in failed:
        first = out.violations[0]
        print(f"\nseed {out.seed}: VIOLATION {first.invariant} on day {first.day:.2f} "
              f"({first.at:%Y-%m-%d %H:%M:%S}): {first.detail}")
        print("the steps that led there:")
        for line in out.trail:
            print(f"  {line}")
        inject = f" --inject {args.inject}" if args.inject else ""
        from bench.simulate.deployment import passed_settings

        settings = "".join(f"{k}={shlex.quote(v)} " for k, v in passed_settings().items())
        print(f"replay: {settings}python -m bench simulate --seed {out.seed} --days "
              f"{out.days}{inject}")
    return 1 if failed else 0
