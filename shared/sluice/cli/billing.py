"""``sluice billing …``: metering outbox repairs. Changes are audited as the operator
(``--by``, else ``cli:$USER``) in ``admin_audit``."""

from __future__ import annotations

import argparse
from typing import Any

from sluice.cli.main import command_group, operator, services
from sluice.cli.output import emit


def cmd_reset_attempts(args: argparse.Namespace) -> int:
    from sluice.billing.reset import reset_attempts

    result = reset_attempts(services().db, actor=operator(args.by), ids=args.id or (),
                            include_refused=args.include_refused, dry_run=args.dry_run)
    verb = "would reset" if result.dry_run else "reset"
    note = (f"kept {len(result.kept)} row(s) Polar refused for good (name them with --id, "
            "or --include-refused, once their cause is fixed)")
    kept = [note] if result.kept else []
    emit(result.to_json(), lambda body: [
        f"{verb} {len(result.reset)} exhausted row(s) to pending with no attempts",
        *(f"  {row_id}" for row_id in body["ids"]), *kept])
    return 0


def register(sub: Any) -> None:
    add = command_group(sub, "billing", "metering outbox repairs")
    p = add("reset-attempts", cmd_reset_attempts,
            "give exhausted outbox rows their attempts back (by default those an outage "
            "exhausted); audited")
    p.add_argument("--id", action="append", metavar="ID", help="only this row (repeatable)")
    p.add_argument("--include-refused", action="store_true",
                   help="also rows Polar refused for good (a 4xx on the event)")
    p.add_argument("--dry-run", action="store_true", help="list what would be reset; change nothing")
