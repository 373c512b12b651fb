"""Writes Sluice's own serverless wiring from its job and topic tables.

``python -m infra.generate`` is ``sluice generate`` for this repository: it rewrites
``infra/queues.yml``, ``infra/alarms.yml``, ``infra/iam.yml`` and the generated block of
``serverless.yml`` from Sluice's own ``JOBS`` and ``TOPICS`` (every pack, no app
extensions: this repository deploys Sluice alone), with the handlers in ``functions/``. ``--check`` only
says which of them differ (exit 1), as the test suite does.

Run at development time only: nothing in a Lambda imports this module.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sluice.deploy import generate as _generate
from sluice.deploy.generate import BEGIN, END, Deployment, functions_block, serverless_yml
from sluice.deploy.resources import (
    alarms_yml,
    camel,
    iam_yml,
    job_role,
    lambda_id,
    pascal,
    queues_yml,
)
from sluice.jobs.registry import JOBS, Job
from sluice.queues.topics import TOPICS, Topic

ROOT = Path(__file__).resolve().parents[1]
TARGET = Deployment(ROOT, handlers="functions/")

__all__ = ["BEGIN", "END", "ROOT", "alarms_yml", "camel", "functions_block", "iam_yml",
           "job_role", "lambda_id", "main", "outputs", "pascal", "queues_yml", "serverless_yml",
           "stale"]


def tables() -> tuple[dict[str, Job], dict[str, Topic]]:
    """Sluice's own deployment: its core and every pack, whatever app this process sees."""
    return dict(JOBS.using(())), dict(TOPICS.using(()))


def outputs(root: Path = ROOT) -> dict[Path, str]:
    return _generate.outputs(TARGET._replace(root=root), *tables())


def stale(root: Path = ROOT) -> list[Path]:
    return _generate.stale(TARGET._replace(root=root), *tables())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.generate", description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a generated file differs")
    args = parser.parse_args(argv)
    if args.check:
        differ = stale()
        for path in differ:
            print(f"stale: {path.relative_to(ROOT)} (run python -m infra.generate)",
                  file=sys.stderr)
        return 1 if differ else 0
    for path in _generate.write(TARGET, *tables()):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
