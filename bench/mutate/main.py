"""``python -m bench mutate [--only ID ...] [--seed N ...] [--days D] [--jobs J]
[--timeout S] [--no-control] [--list | --check] [--min-kill P]``

First the unmutated tree (the *control*) runs on the same seeds and days: a violation
there makes every verdict meaningless, so the command stops (exit 2). Then each mutant
of ``catalog.toml`` is applied to a scratch copy of the tree of its own (``shared/``,
``bench/``, ``serverless.yml``; the real checkout is never written) and the simulator runs
there (``python -m bench simulate --limits``: worlds that reach Sluice's limits on
purpose, ``bench/simulate/limits.py``; the copy's ``shared/`` first on ``PYTHONPATH``),
one seed after another until one shows a violation. A mutant is

- ``killed``: an invariant failed (its name, the seed and the simulated day are shown);
- ``timeout``: the run took longer than ``--timeout`` (a defect that loops or stalls);
- ``crashed``: the simulator stopped on an error (a defect the code under test raised
  through everything, shown by its last line);
- ``survived``: every seed ran clean.

The first three are detected. Exit 1 when fewer than ``--min-kill`` percent (default 90)
of the mutants run are detected.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from bench.mutate.catalog import ROOT, Mutant, check, load

# The reduced run: with --limits, seeds whose worlds reach every event kind the invariants
# judge, every channel among them (tests/unit/bench/test_simulate_limits.py).
DEFAULT_SEEDS = (1, 4)
DEFAULT_DAYS = 10
COPIED = ("shared", "bench", "serverless.yml")
VIOLATION = re.compile(r"^seed (\d+): VIOLATION (\S+) on day ([\d.]+) \([^)]*\): (.*)$",
                       re.MULTILINE)


class Verdict(NamedTuple):
    mutant: str
    file: str
    result: str  # killed | timeout | crashed | survived
    invariant: str = ""
    seed: int | None = None
    day: float | None = None
    detail: str = ""
    wall_s: float = 0.0

    @property
    def detected(self) -> bool:
        return self.result != "survived"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench mutate")
    parser.add_argument("--only", action="append", metavar="ID",
                        help="run this mutant (repeat for several; default: all)")
    parser.add_argument("--seed", type=int, action="append",
                        help=f"simulate this seed (repeat; default {DEFAULT_SEEDS})")
    parser.add_argument("--days", type=int, default=DEFAULT_DAYS,
                        help=f"simulated days a seed (default {DEFAULT_DAYS})")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds a mutant's seed may take (default: 4x the control's "
                             "slowest seed, at least 120)")
    parser.add_argument("--no-control", action="store_true",
                        help="skip the unmutated run (its verdicts are then unchecked)")
    parser.add_argument("--min-kill", type=float, default=90.0,
                        help="percent of mutants that must be detected (default 90)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="print the catalog, run nothing")
    what.add_argument("--check", action="store_true",
                      help="check every find text occurs exactly once, run nothing")
    args = parser.parse_args(argv)
    if args.days < 1 or args.jobs < 1:
        parser.error("--days and --jobs must be at least 1")
    if args.timeout is not None and args.timeout <= 0:
        parser.error("--timeout must be positive")
    return args


def _memory() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def copy_tree(source: Path, target: Path) -> None:
    """The parts of the tree a simulation runs from (no caches, no virtualenv)."""
    for name in COPIED:
        if (source / name).is_dir():
            shutil.copytree(source / name, target / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source / name, target / name)


@contextmanager
def snapshot() -> Iterator[Path]:
    """The tree as it is when the command starts: every mutant is cut from this copy, so
    edits to the checkout during a long run change none of its verdicts."""
    with tempfile.TemporaryDirectory(prefix="sluice-mutate-base-", dir=_memory()) as directory:
        copy_tree(ROOT, Path(directory))
        yield Path(directory)


@contextmanager
def scratch_tree(base: Path, mutant: Mutant | None) -> Iterator[Path]:
    """A copy of ``base`` (memory-backed when possible) with ``mutant`` applied."""
    with tempfile.TemporaryDirectory(prefix="sluice-mutant-", dir=_memory()) as directory:
        root = Path(directory)
        copy_tree(base, root)
        if mutant is not None:
            mutant.apply(root)
        yield root


def simulate(root: Path, seed: int, days: int, timeout: float | None
             ) -> tuple[str, str, float]:
    """One seed in the tree at ``root``: (result, output, wall seconds); result is
    ``clean``, ``violation``, ``timeout`` or ``crashed``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLUICE_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(root / "shared")  # ahead of the installed (editable) sluice
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "bench", "simulate", "--quiet", "--limits", "--seed",
             str(seed), "--days", str(days)], cwd=root, env=env, capture_output=True, text=True,
            timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return "timeout", "", time.perf_counter() - started
    wall = time.perf_counter() - started
    if done.returncode == 0:
        return "clean", done.stdout, wall
    if done.returncode == 1 and VIOLATION.search(done.stdout):
        return "violation", done.stdout, wall
    lines = (done.stderr or done.stdout).strip().splitlines()
    return "crashed", lines[-1] if lines else f"exit {done.returncode}", wall


def judge(base: Path, mutant: Mutant, seeds: list[int], days: int,
          timeout: float | None) -> Verdict:
    wall = 0.0
    with scratch_tree(base, mutant) as root:
        for seed in seeds:
            result, output, took = simulate(root, seed, days, timeout)
            wall += took
            if result == "violation":
                found = VIOLATION.search(output)
                assert found is not None
                return Verdict(mutant.id, mutant.file, "killed", found.group(2), seed,
                               float(found.group(3)), found.group(4)[:160], wall)
            if result in ("timeout", "crashed"):
                return Verdict(mutant.id, mutant.file, result, seed=seed,
                               detail=output[:160], wall_s=wall)
    return Verdict(mutant.id, mutant.file, "survived", wall_s=wall)


def control(base: Path, seeds: list[int], days: int) -> float:
    """The unmutated tree on the same seeds: the slowest seed's wall time. Exits 2 on a
    violation (or when the copy does not import its own ``sluice``)."""
    slowest = 0.0
    with scratch_tree(base, None) as root:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = str(root / "shared")
        where = subprocess.run([sys.executable, "-c", "import sluice; print(sluice.__file__)"],
                               cwd=root, env=env, capture_output=True, text=True, check=True)
        if not where.stdout.strip().startswith(str(root)):
            raise SystemExit(f"the scratch copy imports sluice from {where.stdout.strip()}, "
                             "not from the copy: mutants would not be run")
        for seed in seeds:
            result, output, took = simulate(root, seed, days, None)
            slowest = max(slowest, took)
            print(f"control: seed {seed} x {days} days: {result} ({took:.0f} s)",
                  file=sys.stderr, flush=True)
            if result != "clean":
                print(output[-4000:])
                raise SystemExit(2)
    return slowest


def table(verdicts: list[Verdict]) -> str:
    rows = [["mutant", "file", "result", "invariant", "seed", "day", "wall s"]]
    for v in verdicts:
        rows.append([v.mutant, v.file.removeprefix("shared/sluice/"), v.result,
                     v.invariant or (v.detail[:60] if v.result == "crashed" else ""),
                     "" if v.seed is None else str(v.seed),
                     "" if v.day is None else f"{v.day:.2f}", f"{v.wall_s:.0f}"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parse(list(argv if argv is not None else sys.argv[1:]))
    mutants = load()
    if args.only:
        known = {m.id for m in mutants}
        unknown = [name for name in args.only if name not in known]
        if unknown:
            print(f"--only: unknown mutant(s) {', '.join(unknown)}", file=sys.stderr)
            return 64
        mutants = [m for m in mutants if m.id in args.only]
    problems = check(mutants)
    if args.list:
        for m in mutants:
            print(f"{m.id}  {m.file}\n    {m.breaks}")
        return 0
    if problems or args.check:
        print("\n".join(problems) or f"{len(mutants)} mutants: every find text occurs once")
        return 1 if problems else 0
    seeds = args.seed or list(DEFAULT_SEEDS)
    started = time.perf_counter()
    timeout = args.timeout
    with snapshot() as base:
        if not args.no_control:
            slowest = control(base, seeds, args.days)
            timeout = timeout or max(120.0, 4 * slowest)
        with ThreadPoolExecutor(args.jobs) as pool:
            verdicts = []
            for verdict in pool.map(lambda m: judge(base, m, seeds, args.days, timeout),
                                    mutants):
                verdicts.append(verdict)
                print(f"{verdict.mutant}: {verdict.result} {verdict.invariant} "
                      f"({verdict.wall_s:.0f} s)", file=sys.stderr, flush=True)
    print(table(verdicts))
    detected = sum(v.detected for v in verdicts)
    by_invariant = sum(v.result == "killed" for v in verdicts)
    share = 100.0 * detected / len(verdicts) if verdicts else 100.0
    print(f"\n{detected} of {len(verdicts)} mutants detected ({share:.0f} %; {by_invariant} "
          f"by an invariant), seeds {','.join(map(str, seeds))} x {args.days} days, "
          f"{time.perf_counter() - started:.0f} s")
    survivors = [v.mutant for v in verdicts if not v.detected]
    if survivors:
        print(f"survived: {', '.join(survivors)}")
    return 0 if share >= args.min_kill else 1
