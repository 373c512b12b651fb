"""``sluice generate``: write an app's deployment (serverless.yml, infra/) from the tables.

Run from the app's deployment folder with the wheel and the app installed: the app's
jobs and topics come from its extension module (``sluice.core.extensions``), Sluice's own
from the wheel, and each gets its function, schedule, queue, DLQ, alarms and role.
``--check`` also starts every function as its zip will (``sluice.deploy.probe``): one that
cannot find its job, topic or the app's channels fails the check, named.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sluice.cli.main import EXIT_FAILURES, EXIT_OK
from sluice.cli.output import emit
from sluice.core.errors import RequestError


def app_packages() -> tuple[str, ...]:
    """The top-level packages of the app's extension modules: what its zips must ship."""
    from sluice.core.extensions import extensions

    return tuple(dict.fromkeys(p for e in extensions() for p in e.packages))


def app_modules() -> tuple[str, ...]:
    """The app's extension modules: its deployment's SLUICE_APP."""
    from sluice.core.extensions import extensions

    return tuple(e.module.__name__ for e in extensions())


def cmd_generate(args: argparse.Namespace) -> int:
    from sluice.deploy.generate import Deployment, stale, write
    from sluice.jobs.registry import JOBS
    from sluice.queues.topics import TOPICS

    root = Path(args.dir).resolve()
    if not root.is_dir():
        raise RequestError(f"--dir {args.dir!r} is not a folder", field="--dir")
    target = Deployment(root, service=args.service,
                        packages=tuple(args.package or ()) or app_packages(),
                        modules=app_modules())
    jobs, topics = dict(JOBS), dict(TOPICS)
    paths = stale(target, jobs, topics) if args.check else write(target, jobs, topics)
    body: dict[str, Any] = {
        "dir": str(root), "check": args.check,
        "stale" if args.check else "written": [str(p.relative_to(root)) for p in paths],
        "jobs": sorted(jobs), "topics": sorted(topics)}
    failed = []
    if args.check and (root / "serverless.yml").exists():
        from sluice.deploy.probe import cold_starts

        starts = cold_starts(root)
        body["coldStarts"] = [s._asdict() for s in starts]
        failed = [s for s in starts if s.error is not None]
    emit(body, lambda b: [*(f"{'stale' if args.check else 'wrote'} {p}"
                            for p in b["stale" if args.check else "written"]),
                          *(f"cannot start {s.function} ({s.handler}): {s.error}"
                            for s in failed),
                          f"{len(b['jobs'])} jobs, {len(b['topics'])} topics"
                          + (f"; {len(body['coldStarts']) - len(failed)} of "
                             f"{len(body['coldStarts'])} functions start"
                             if "coldStarts" in body else "")])
    return EXIT_FAILURES if args.check and (paths or failed) else EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser("generate", help="write the deployment's functions, schedules, queues, "
                                        "alarms and IAM (serverless.yml, infra/) from the tables")
    p.add_argument("--dir", default=".", help="the deployment folder (default: here)")
    p.add_argument("--service", default="app",
                   help="the service name of a new serverless.yml (default app)")
    p.add_argument("--package", action="append",
                   help="a package the zips ship (default: the extension modules' packages)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 2 if a generated file differs or a function "
                        "cannot start (its job, topic or the app's channels not found)")
    p.set_defaults(func=cmd_generate)
