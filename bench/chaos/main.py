"""``python -m bench chaos``: run the sweep and print one table of figures.

Exit status 1 when anything was lost, left stuck, or duplicated where nothing
deduplicates it. Attempts burned by faults are shown, and asserted to be zero by the
tests where the drain promises it.
"""

from __future__ import annotations

import argparse
import sys

from bench.chaos.faults import PROVIDER_FAULTS, provider_faults, store_faults
from bench.chaos.kill import Plan, Tally, random_kills, sweep
from bench.chaos.stores import BACKENDS

SUITES = ("kill", "random", "provider", "store")
HEADER = ("scenario", "runs", "lost", "duplicated effects", "stuck", "attempts burned by faults")


def table(tallies: list[Tally]) -> str:
    rows = [HEADER] + [
        (t.scenario, f"{t.runs} ({t.reached} {t.verb})", str(t.lost),
         f"{t.duplicated} ({t.unexpected} unexpected)" if t.duplicated else "0",
         str(t.stuck), str(t.burned))
        for t in tallies]
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("---" for _ in HEADER) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench chaos", description=__doc__)
    parser.add_argument("--backend", action="append", choices=BACKENDS,
                        help="store backend (repeatable; default both)")
    parser.add_argument("--positions", default="1,2,3",
                        help="crash positions N of SLUICE_CRASH_AT=point@N (default 1,2,3)")
    parser.add_argument("--point", action="append",
                        help="only this crash point (repeatable; default every one found)")
    parser.add_argument("--suite", action="append", choices=SUITES,
                        help="kill sweep, kills at random moments, provider faults, store faults "
                             "(repeatable; default all)")
    parser.add_argument("--seed", type=int, default=14, help="seed of the random kill moments")
    parser.add_argument("--fault", action="append", choices=PROVIDER_FAULTS,
                        help="only this provider fault (repeatable; default all)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each run")
    args = parser.parse_args(argv)
    plan = Plan(backends=tuple(args.backend or BACKENDS),
                positions=tuple(int(n) for n in args.positions.split(",")))

    def progress(line: str) -> None:
        if args.verbose:
            print(line, file=sys.stderr, flush=True)

    suites = args.suite or list(SUITES)
    tallies: list[Tally] = []
    if "kill" in suites:
        tallies += sweep(plan, points=args.point, progress=progress)
    if "random" in suites:
        tallies += random_kills(plan.backends, seed=args.seed, progress=progress)
    if "provider" in suites:
        tallies += provider_faults(plan.backends, tuple(args.fault or PROVIDER_FAULTS),
                                   progress=progress)
    if "store" in suites:
        tallies += store_faults(plan.backends, progress=progress)
    print(table(tallies))
    for tally in tallies:
        for note in dict.fromkeys(tally.notes):
            print(f"note: {tally.scenario}: {note}", file=sys.stderr)
    return 1 if any(t.lost or t.stuck or t.unexpected for t in tallies) else 0
