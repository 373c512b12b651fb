"""``sluice audit``: the audit trail of actions, newest first, with the API's filters."""

from __future__ import annotations

import argparse
from typing import Any

from sluice.cli.main import services
from sluice.cli.output import emit


def cmd_audit(args: argparse.Namespace) -> int:
    from sluice.ops.audit import find, parse_filter

    values = {"actor": args.actor, "action": args.action, "target": args.target,
              "since": args.since, "until": args.until, "limit": str(args.limit)}
    flt = parse_filter({k: v for k, v in values.items() if v is not None})
    emit(find(services().db, flt), lambda body: [
        *(f"{e['at']}  {e['actor']}  {e['action']}  {e['target'] or '-'}  {e['outcome']}"
          for e in body["entries"]),
        *([] if body["entries"] else ["no action matches"])])
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("audit", help="the audit trail of admin actions, newest first")
    p.add_argument("--actor", help="only this actor (exact)")
    p.add_argument("--action", help="only this action, e.g. dlq:purge (exact)")
    p.add_argument("--target", help="only targets starting with this")
    p.add_argument("--since", help="from this ISO 8601 time (inclusive), e.g. 2026-12-01T00:00:00Z")
    p.add_argument("--until", help="before this ISO 8601 time (exclusive)")
    p.add_argument("--limit", type=int, default=100, help="at most this many (1-1000)")
    p.add_argument("--json", action="store_true", help="print JSON on stdout")
    p.set_defaults(func=cmd_audit)
