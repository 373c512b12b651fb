"""``sluice schedule disable JOB --reason R`` / ``enable JOB``: mark a job whose schedule an
operator switched off on purpose, so ``sluice jobs``, the API and the console show it
``disabled`` rather than ``overdue`` (and take the mark off again). Audited as the API's
``<job>:disable`` / ``<job>:enable``, as the operator (``--by``, else ``cli:$USER``)."""

from __future__ import annotations

import argparse
from typing import Any

from sluice.cli.main import audited, command_group, operator, services
from sluice.cli.output import emit


def cmd_disable(args: argparse.Namespace) -> int:
    from sluice.jobs.overdue import DisabledMarks
    from sluice.jobs.registry import get_job
    from sluice.store.db import utcnow

    job = get_job(args.job)
    svc = services()
    actor = operator(args.by)
    with audited(svc, actor, f"{job.name}:disable", f"/api/admin/jobs/{job.name}/disabled",
                 {"reason": args.reason}) as record:
        mark = DisabledMarks(svc.db).mark_disabled(job.name, reason=args.reason, actor=actor,
                                                   now=utcnow())
        record["outcome"] = "disabled"
    emit({"job": job.name, "disabled": mark}, lambda body: [
        f"{body['job']}: marked disabled on purpose ({body['disabled']['reason']})"])
    return 0


def cmd_enable(args: argparse.Namespace) -> int:
    from sluice.jobs.overdue import DisabledMarks
    from sluice.jobs.registry import get_job

    job = get_job(args.job)
    svc = services()
    with audited(svc, operator(args.by), f"{job.name}:enable",
                 f"/api/admin/jobs/{job.name}/disabled") as record:
        was = DisabledMarks(svc.db).mark_enabled(job.name)
        record["outcome"] = "enabled" if was else "not_disabled"
    emit({"job": job.name, "disabled": None, "wasDisabled": was}, lambda body: [
        f"{body['job']}: " + ("the disabled mark is off" if body["wasDisabled"]
                              else "was not marked disabled")])
    return 0


def register(sub: Any) -> None:
    add = command_group(sub, "schedule", "mark a job's schedule disabled on purpose (or not)")
    p = add("disable", cmd_disable, "mark JOB's schedule as switched off on purpose: shown "
            "disabled, not overdue")
    p.add_argument("job")
    p.add_argument("--reason", required=True, help="why (shown with the mark; 1-200 characters)")
    add("enable", cmd_enable, "take the disabled mark off JOB").add_argument("job")
