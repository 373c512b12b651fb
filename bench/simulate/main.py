"""``python -m bench simulate [--seed N | --seeds K [--first F]] [--days D] [--jobs J]
[--inject NAME] [--keep-going] [--limits] [--quiet] [--coverage [--coverage-data PATH]]``

Runs each seed's simulation (see ``bench/simulate/__init__.py``), prints one row per seed
and a total, and exits 1 when any invariant was violated. A failing seed prints the
invariant, the simulated day, the steps that led there and the command that replays it.
With ``--coverage`` it also prints which product code the run executed: line and branch
coverage of ``sluice`` per package (``reach.py``).
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
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.simulate.clock import SimClock
from bench.simulate.rogue import INJECTIONS

ALSO = 20  # the violations listed after the first, per seed
HEADER = ["seed", "days", "steps", "runs", "coalesced", "faults", "deliveries", "violations",
          "digest", "wall s"]


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
    parser.add_argument("--limits", action="store_true",
                        help="add the faults and load that reach Sluice's limits on purpose "
                             "(bench/simulate/limits.py; python -m bench mutate uses it)")
    parser.add_argument("--inject", choices=INJECTIONS,
                        help="switch on a known defect, to see the invariants catch it")
    parser.add_argument("--store", choices=("sqlite", "postgres"),
                        help="run every seed on this SQL store (default: SQLite, and with "
                             "--limits Postgres for every third seed; bench/simulate/stores.py)")
    parser.add_argument("--coverage", action="store_true",
                        help="measure the line and branch coverage of sluice the run "
                             "executes (coverage.py) and print it per package")
    parser.add_argument("--coverage-data", metavar="PATH",
                        help="with --coverage: keep the combined coverage data there "
                             "(for coverage report / coverage html --data-file PATH)")
    parser.add_argument("--from-rows", nargs="+", metavar="FILE",
                        help="run nothing: the table of the per-seed rows saved from earlier "
                             "runs (what a run prints to stderr; '#' lines are comments), "
                             "for one run split over several sittings")
    args = parser.parse_args(argv)
    if args.coverage_data and not args.coverage:
        parser.error("--coverage-data needs --coverage")
    if args.from_rows:
        defaults = vars(parser.parse_args([]))  # the options' own defaults, not a copy
        given = [f"--{name.replace('_', '-')}" for name, value in vars(args).items()
                 if name != "from_rows" and value != defaults[name]]
        if given:
            parser.error(f"--from-rows runs nothing: {', '.join(given)} would be ignored")
    return args


def _from_rows(paths: list[str]) -> int:
    """The table of saved per-seed rows: each seed once, one length; exits 1 on any
    violation, as the run would have."""
    rows, seen, lengths = [HEADER], set(), set()
    totals: dict[str, int] = {}
    sums = [0, 0, 0, 0, 0]  # steps, runs, coalesced, deliveries, violations
    wall = 0.0
    for path in paths:
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.split()
            try:
                seed, days, steps, runs, coalesced = (int(f) for f in fields[:5])
                deliveries, violations = int(fields[-4]), int(fields[-3])
                faults = dict(f.split("=", 1) for f in fields[5:-4])
                seconds = float(fields[-1])
                counts = {kind: int(count) for kind, count in faults.items()}
            except ValueError as exc:
                raise SystemExit(f"{path}:{number}: not a per-seed row ({exc}): {line!r}") \
                    from exc
            if seed in seen:
                raise SystemExit(f"{path}:{number}: seed {seed} appears twice")
            seen.add(seed)
            lengths.add(days)
            for kind, count in counts.items():
                totals[kind] = totals.get(kind, 0) + count
            for i, value in enumerate((steps, runs, coalesced, deliveries, violations)):
                sums[i] += value
            wall += seconds
            rows.append([str(seed), str(days), str(steps), str(runs), str(coalesced),
                         _faults(counts), str(deliveries), str(violations), fields[-2],
                         f"{seconds:.1f}"])
    if len(rows) == 1:
        raise SystemExit("no per-seed rows in " + ", ".join(paths))
    if len(lengths) > 1:
        raise SystemExit(f"the rows are of different lengths ({sorted(lengths)} days)")
    rows[1:] = sorted(rows[1:], key=lambda r: int(r[0]))
    days = lengths.pop()
    rows.append([f"{len(seen)} seeds", str(days * len(seen)), str(sums[0]), str(sums[1]),
                 str(sums[2]), _faults(totals), str(sums[3]), str(sums[4]), "",
                 f"{wall:.1f} (sum)"])
    print(_table(rows))
    return 1 if sums[4] else 0


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
             keep_going: bool = False, limits: bool = False, store: str | None = None) -> Any:
    from bench.simulate.engine import Simulation
    from bench.simulate.stores import store_of
    from sluice.jobs import runs

    clock.reset()
    runs._ENDED_UNRELEASED.clear()  # the last seed's run holders: nothing of it carries over
    with tempfile.TemporaryDirectory(prefix=f"sluice-sim-{seed}-", dir=_scratch()) as directory, \
            contextlib.redirect_stdout(_Discard()), \
            contextlib.redirect_stderr(_Discard()):  # the metrics' EMF lines, the logs
        return Simulation(seed, days, Path(directory), clock, inject, keep_going,
                          limits, store_of(seed, limits, store)).run()


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
    from sluice.core.observe import logger

    logger.setLevel(logging.CRITICAL)
    return clock


_WORKER_CLOCK: SimClock | None = None
_WORKER_MEASURE: Any = None


def _worker_setup(measure_in: str | None = None) -> None:
    global _WORKER_CLOCK, _WORKER_MEASURE
    if measure_in is not None:  # before Sluice is imported: its module lines count
        from bench.simulate.reach import Measure

        _WORKER_MEASURE = Measure(Path(measure_in))
        _WORKER_MEASURE.start()
    _WORKER_CLOCK = _setup()


def _worker_run(task: tuple[int, int, str | None, bool, bool, str | None]) -> Any:
    assert _WORKER_CLOCK is not None
    seed, days, inject, keep_going, limits, store = task
    out = run_seed(seed, days, _WORKER_CLOCK, inject, keep_going, limits, store)
    if _WORKER_MEASURE is not None:  # a pool's worker ends without its exit hooks
        _WORKER_MEASURE.save()
    return out


def _outcomes(seeds: list[int], args: argparse.Namespace,
              measure_in: Path | None = None) -> Iterator[Any]:
    """Each seed's outcome, in seed order: in this process, or on ``--jobs`` processes
    (each with its own clock; a seed's history does not depend on where it ran). With
    ``measure_in``, coverage is measured into that directory."""
    tasks = [(seed, args.days, args.inject, args.keep_going, args.limits, args.store)
             for seed in seeds]
    if args.jobs <= 1:
        measure = None
        if measure_in is not None:
            from bench.simulate.reach import Measure

            measure = Measure(measure_in)
            measure.start()
        clock = _setup()
        try:
            for task in tasks:
                yield run_seed(*task[:2], clock, *task[2:])
        finally:
            clock.uninstall()
            if measure is not None:
                measure.stop()
        return
    # spawned, not forked: each worker installs its clock before it imports Sluice
    context = multiprocessing.get_context("spawn")
    initargs = (str(measure_in) if measure_in is not None else None,)
    with context.Pool(min(args.jobs, len(tasks)), initializer=_worker_setup,
                      initargs=initargs) as pool:
        yield from pool.imap(_worker_run, tasks)


def main(argv: list[str] | None = None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    _fixed_hashes(argv)
    args = _parse(argv)
    if args.from_rows:
        return _from_rows(args.from_rows)
    seeds = args.seed if args.seed else list(range(args.first, args.first + args.seeds))
    rows = [HEADER]
    totals: dict[str, int] = {}
    failed = []
    steps = runs = coalesced = deliveries = 0
    rows_reached: Counter[str] = Counter()
    started = time.perf_counter()
    measured = tempfile.TemporaryDirectory(prefix="sluice-sim-coverage-") \
        if args.coverage else None
    measure_in = Path(measured.name) if measured is not None else None
    for out in _outcomes(seeds, args, measure_in):
        skipped = sum(out.coalesced.values())
        rows.append([str(out.seed), str(args.days), str(out.steps), str(out.runs),
                     str(skipped), _faults(out.faults), str(out.deliveries),
                     str(len(out.violations)), out.digest, f"{out.wall_s:.1f}"])
        steps, runs, deliveries = steps + out.steps, runs + out.runs, deliveries + out.deliveries
        coalesced += skipped
        for kind, count in out.faults.items():
            totals[kind] = totals.get(kind, 0) + count
        rows_reached.update(out.rows)
        if out.violations:
            failed.append(out)
        if not args.quiet:
            print(" ".join(rows[-1]), file=sys.stderr, flush=True)
    wall = time.perf_counter() - started
    rows.append([f"{len(seeds)} seeds", str(args.days * len(seeds)), str(steps), str(runs),
                 str(coalesced), _faults(totals), str(deliveries),
                 str(sum(len(o.violations) for o in failed)), "", f"{wall:.1f}"])
    print(_table(rows))
    if measured is not None and measure_in is not None:
        from bench.simulate.reach import combined, table

        keep = Path(args.coverage_data).resolve() if args.coverage_data else None
        print(f"\ncoverage of sluice (line and branch), {len(seeds)} seed(s) x {args.days} "
              f"days{' --limits' if args.limits else ''}:")
        print(table(combined(measure_in, keep)))
        measured.cleanup()
        from bench.simulate.rows import unreached
        from sluice.delivery.policy import TABLE

        missing = unreached(rows_reached)
        print(f"delivery policy rows reached: {len(TABLE) - len(missing)} of {len(TABLE)}"
              + (f"; never: {', '.join(missing)}" if missing else ""))
    for out in failed:
        first = out.violations[0]
        print(f"\nseed {out.seed}: VIOLATION {first.invariant} on day {first.day:.2f} "
              f"({first.at:%Y-%m-%d %H:%M:%S}): {first.detail}")
        for more in out.violations[1:ALSO + 1]:  # --keep-going: the others, briefly
            print(f"  also {more.invariant} on day {more.day:.2f}: {more.detail}")
        print("the steps that led there:")
        for line in out.trail:
            print(f"  {line}")
        inject = f" --inject {args.inject}" if args.inject else ""
        inject += " --limits" if args.limits else ""
        inject += f" --store {args.store}" if args.store else ""
        from bench.simulate.deployment import passed_settings

        settings = "".join(f"{k}={shlex.quote(v)} " for k, v in passed_settings().items())
        print(f"replay: {settings}python -m bench simulate --seed {out.seed} --days "
              f"{out.days}{inject}")
    return 1 if failed else 0
