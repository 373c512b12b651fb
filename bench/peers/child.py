"""One side's run in a process of its own:
``python -m bench.peers.child SIDE STORE TARGET OUT --n N --workers W --batch B --timeout S``.

TARGET is the side's fresh Postgres URL, or the folder its SQLite files go in; the
figures are written to OUT as JSON (stdout is the side's own to log on).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from typing import Any

from bench.peers.common import Spec

# side -> (its module, the stores it runs on)
SIDES: dict[str, tuple[str, tuple[str, ...]]] = {
    "sluice": ("bench.peers.sluice_side", ("postgres", "sqlite")),
    "pgqueuer": ("bench.peers.pgqueuer_side", ("postgres",)),
    "procrastinate": ("bench.peers.procrastinate_side", ("postgres",)),
    "oban": ("bench.peers.oban_side", ("postgres",)),
    "dbos": ("bench.peers.dbos_side", ("postgres", "sqlite")),
    "huey": ("bench.peers.huey_side", ("sqlite",)),
    "persist-queue": ("bench.peers.persistqueue_side", ("sqlite",)),
}


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.child")
    parser.add_argument("side", choices=sorted(SIDES))
    parser.add_argument("store", choices=("postgres", "sqlite"))
    parser.add_argument("target")
    parser.add_argument("out")
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    args = parser.parse_args(argv)
    module, stores = SIDES[args.side]
    if args.store not in stores:
        parser.error(f"{args.side} has no {args.store} store")
    spec = Spec(args.n, args.workers, args.batch, args.timeout)
    measured = importlib.import_module(module).run(args.store, args.target, spec)
    if measured.completed != spec.n:
        raise AssertionError(f"{args.side}: {measured.completed} of {spec.n} jobs counted done")
    summary = {key: _finite(value) for key, value in measured.summary(spec.n).items()}
    with open(args.out, "w") as out:
        json.dump(summary, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
