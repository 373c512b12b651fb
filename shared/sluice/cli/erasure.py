"""``sluice erasure …``: the erasure lifecycle from the command line.

Actions that change something are written to ``admin_audit`` as ``cli:<operator>``
(``--by``, else ``$USER``), like the API's admin actions.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

from sluice.cli.main import audited, command_group, operator, services
from sluice.cli.output import emit, human_lines

EXIT_OK, EXIT_ABORTED, EXIT_FAILED = 0, 1, 2


def _services() -> Any:
    return services()


def _operator(args: argparse.Namespace) -> str:
    return operator(args.by)


def _print(args: argparse.Namespace, body: Any) -> None:
    emit(body, lambda body: _lines(body, many=isinstance(body, list)))


def _lines(body: Any, *, many: bool) -> Iterator[str]:
    for row in body if many else [body]:
        if "status" not in row or "subjectUserId" not in row:
            yield from human_lines(row)
            continue
        yield (f"{row['id']}  {row['status']:<9}  subject={row['subjectUserId']}  "
               f"grace_until={row['graceUntil']}  purged_at={row['purgedAt'] or '-'}")
        if row.get("lastError"):
            yield f"  last error: {row['lastError']}"
        if row.get("result") and not many:
            yield f"  result: {json.dumps(row['result'], ensure_ascii=False)}"


def cmd_request(args: argparse.Namespace) -> int:
    from sluice.erasure.requests import ErasureStore
    from sluice.ops.door import admit

    services = _services()
    checked = admit("request_erasure", {
        "subjectUserId": args.subject, "tenantId": args.tenant, "graceDays": args.grace_days,
        "requestedBy": _operator(args)}, services.settings)
    subject, tenant, grace = checked["subjectUserId"], checked["tenantId"], checked["graceDays"]
    actor = checked["requestedBy"]
    with audited(services, actor, "erasure:create", None) as record:
        request, created = ErasureStore(services.db).create(subject, requested_by=actor,
                                                             grace_days=grace, tenant_id=tenant)
        record.update(target=request.id, outcome="created" if created else "existing")
    if not args.json and not created:
        print("an open request already exists for this subject:", file=sys.stderr)
    _print(args, request.to_json())
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    from sluice.erasure.requests import ErasureStore, check_status

    rows = ErasureStore(_services().db).list(status=check_status(args.status), limit=args.limit)
    _print(args, [row.to_json() for row in rows])
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    from sluice.erasure.requests import ErasureStore

    _print(args, ErasureStore(_services().db).get(args.id).to_json())
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    from sluice.erasure.requests import ErasureStore

    services = _services()
    with audited(services, _operator(args), "erasure:cancel", args.id) as record:
        request = ErasureStore(services.db).cancel(args.id)
        record["outcome"] = "cancelled"
    _print(args, request.to_json())
    return EXIT_OK


def _confirmed(args: argparse.Namespace) -> bool:
    """A purge is irreversible: ``--yes``, or a ``yes`` typed on a terminal."""
    from sluice.core.errors import RequestError

    if args.dry_run or args.yes:
        return True
    if not sys.stdin.isatty():
        raise RequestError("erasure confirm purges for good and stdin is not a terminal: "
                           "pass --yes to confirm without a prompt")
    print(f"Purge erasure request {args.id} now? It cannot be undone. Type 'yes' to go on: ",
          end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() == "yes"


def cmd_confirm(args: argparse.Namespace) -> int:
    from sluice.erasure.purge import confirm

    if not _confirmed(args):
        print("not confirmed: nothing was purged", file=sys.stderr)
        return EXIT_ABORTED
    services = _services()
    actor = _operator(args)
    if args.dry_run:
        request, outcome = confirm(services, args.id, confirmed_by=actor, dry_run=True)
        _print(args, {"id": request.id, "dryRun": True, "wouldPurge": outcome.tables})
        return EXIT_OK
    with audited(services, actor, "erasure:confirm", args.id) as record:
        request, outcome = confirm(services, args.id, confirmed_by=actor, dry_run=False)
        record.update(outcome=outcome.status, detail=outcome.to_json())
    _print(args, request.to_json())
    return EXIT_OK if outcome.status == "purged" else EXIT_FAILED


def cmd_purge(args: argparse.Namespace) -> int:
    from sluice.jobs.registry import get_job
    from sluice.jobs.runner import run_job

    outcome = run_job(get_job("erasure-purge"), _services(), "cli",
                      params={"dryRun": "true"} if args.dry_run else {})
    emit(outcome.body)
    return {"ok": 0, "skipped": 0, "failures": 2}.get(outcome.outcome, 1)


def cmd_verify(args: argparse.Namespace) -> int:
    from sluice.erasure.purge import count_subject
    from sluice.erasure.requests import check_subject

    counts = count_subject(_services(), check_subject(args.subject, "SUBJECT"))
    clean = not any(counts.values())
    _print(args, {"subjectUserId": args.subject, "remaining": counts, "clean": clean})
    return EXIT_OK if clean else EXIT_FAILED


def cmd_registry(args: argparse.Namespace) -> int:
    from sluice.erasure.registry import (
        EXEMPTIONS,
        EXTERNAL_STORES,
        TARGETS,
        schema_columns,
        stale,
        unregistered,
    )

    problems: list[str] = []
    if args.check:
        columns = schema_columns(_services().db)
        problems = [f"unregistered user column {t}.{c}" for t, c in unregistered(columns)]
        problems += [f"registry names a missing column {t}.{c}" for t, c in stale(columns)]
    body = {"targets": [{"how": t.how.value, "name": t.name, "note": t.note} for t in TARGETS],
            "exemptions": [{"table": e.table, "column": e.column, "reason": e.reason}
                           for e in EXEMPTIONS],
            "externalStores": [store.name for store in EXTERNAL_STORES],
            "problems": problems if args.check else None}
    emit(body, _registry_lines)
    if not args.json:
        for problem in problems:
            print(problem, file=sys.stderr)
    return EXIT_FAILED if problems else EXIT_OK


def _registry_lines(body: dict[str, Any]) -> Iterator[str]:
    for t in body["targets"]:
        yield f"{t['how']:<12} {t['name']:<38} {t['note']}"
    for e in body["exemptions"]:
        where = e["table"] + ("." + e["column"] if e["column"] else "")
        yield f"{'exempt':<12} {where:<38} {e['reason']}"
    for name in body["externalStores"]:
        yield f"{'after commit':<12} {name}"


def register(sub: Any) -> None:
    add = command_group(sub, "erasure", "GDPR erasure requests: request, list, confirm, purge")

    p = add("request", cmd_request, "create an erasure request (or show the open one)")
    p.add_argument("subject", metavar="SUBJECT", help="the user id to erase")
    p.add_argument("--tenant")
    p.add_argument("--grace-days", type=int, help="default SLUICE_ERASURE_GRACE_DAYS; 0 = due now")
    p = add("list", cmd_list, "list requests, newest first", by=False)
    p.add_argument("--status", choices=["requested", "cancelled", "purged", "failed"])
    p.add_argument("--limit", type=int, default=100)
    add("show", cmd_show, "show one request", by=False).add_argument("id")
    add("cancel", cmd_cancel, "cancel a request still in its grace window").add_argument("id")
    p = add("confirm", cmd_confirm, "purge one request now (requested or failed); asks first "
            "on a terminal")
    p.add_argument("id")
    p.add_argument("--dry-run", action="store_true", help="count what would go; change nothing")
    p.add_argument("--yes", action="store_true",
                   help="confirm without a prompt (required when stdin is not a terminal)")
    p = add("purge", cmd_purge, "run erasure-purge now (every due request)", by=False)
    p.add_argument("--dry-run", action="store_true", help="count what would go; change nothing")
    add("verify", cmd_verify, "count what every store still holds of a user (exit 2 if any)",
        by=False).add_argument("subject", metavar="SUBJECT")
    p = add("registry", cmd_registry, "print the erasure registry", by=False)
    p.add_argument("--check", action="store_true",
                   help="compare with the live schema; exit 2 on an unregistered user column")
