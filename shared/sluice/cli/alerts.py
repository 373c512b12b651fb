"""``sluice alerts rules SCOPE [--set FILE]``: show a scope's alert rules, or replace them
with the JSON list in FILE (``-`` for stdin). A replacement is recorded in
``admin_audit`` as the operator (``--by``, else ``cli:$USER``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sluice.cli.main import command_group, operator, services
from sluice.cli.output import emit


def cmd_rules(args: argparse.Namespace) -> int:
    from sluice.alerts.rules import RulesStore, rules_body
    from sluice.core.validate import load_json
    from sluice.jobs.runs import RunStore

    svc = services()
    store = RulesStore(svc)
    if args.set is None:
        rules = store.get(args.scope)
        if not rules:
            from sluice.rss.store import RssStore

            RssStore(svc.db).scope(args.scope)  # an unknown scope is a usage error (64)
        body = rules_body(args.scope, rules)
    else:
        raw = sys.stdin.read() if args.set == "-" else Path(args.set).read_text()
        document: Any = load_json(raw, field="rules")
        outcome = "400"
        try:
            body = rules_body(args.scope, store.put(args.scope, document))
            outcome = "200"
        finally:
            RunStore(svc.db).audit(actor=operator(args.by), action="alerts:rules_set",
                                   target=f"alerts-rules:{args.scope}", outcome=outcome,
                                   ip=None, detail=None)
    emit(body, lambda body: [f"{body['scopeId']}: {len(body['rules'])} rule(s)", *(
        f"  [{'on ' if rule['enabled'] else 'off'}] {rule['id']}: "
        f"{', '.join(rule['match']['keywords'])} -> "
        f"{rule['destination']['channel']}:{rule['destination']['recipient']}"
        for rule in body["rules"])])
    return 0


def register(sub: Any) -> None:
    add = command_group(sub, "alerts", "alert rules of tenant scopes")
    p = add("rules", cmd_rules, "show a scope's rules, or replace them (--set FILE)")
    p.add_argument("scope")
    p.add_argument("--set", metavar="FILE", help="a JSON rule list (or {\"rules\": [...]}); "
                   "- reads stdin")
