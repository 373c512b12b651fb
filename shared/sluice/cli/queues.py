"""``sluice sign | verify | publish | flags | dlq`` for runbooks."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sluice.cli.main import audited, operator, services
from sluice.cli.output import age, emit, emit_json, mode
from sluice.core.errors import RequestError
from sluice.core.validate import load_json


def _services() -> Any:
    return services()


def _read_json(what: str) -> Any:
    return load_json(sys.stdin.read(), field=what)


def _print(value: Any) -> None:
    emit(value)


def _actor() -> str:
    return operator()


def _signer() -> Any:
    from sluice.core.settings import Settings
    from sluice.queues.signing import Signer

    return Signer(Settings.from_env().queue_signing_secrets)


def cmd_sign(args: argparse.Namespace) -> int:
    message = _read_json("the message")
    if not isinstance(message, dict):
        raise RequestError("the message must be a JSON object")
    emit_json(_signer().sign(message), compact=True)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    message = _read_json("the message")
    reason = _signer().check(message)
    if mode().json:
        emit({"valid": reason is None, "reason": reason})
    elif reason is None:
        print("valid")
    if reason is not None and not mode().json:
        print(f"invalid: {reason}", file=sys.stderr)
    return 0 if reason is None else 1


def cmd_publish(args: argparse.Namespace) -> int:
    from sluice.ops.door import admit
    from sluice.queues.runtime import publisher_of

    text = sys.stdin.read()
    fields = load_json(text, field="fields") if text.strip() else {}
    if not isinstance(fields, dict):
        raise RequestError("the fields must be a JSON object")
    services = _services()
    checked = admit("publish", {"topic": args.topic, "fields": fields}, services.settings)
    published = publisher_of(services).publish(checked["topic"], checked["fields"])
    _print(published.to_dict())
    return 0 if published.dispatched else 2


def cmd_flags(args: argparse.Namespace) -> int:
    from sluice.jobs.runs import RunStore
    from sluice.rss.store import RssStore
    from sluice.store.flags import FlagStore

    services = _services()
    flags = FlagStore(services.state, scope_exists=RssStore(services.db).has_scope)
    if args.key is None:
        _print({"flags": flags.all()})
        return 0
    if args.value is None and not args.clear:
        _print(flags.describe(args.key))
        return 0
    body: dict[str, Any] = {"key": args.key, "tenantScopeId": args.tenant}
    if args.clear:
        body["clearOverride"] = True
    else:
        body["enabled"] = args.value == "on"
    _print(flags.apply(body, actor=_actor(), audit=RunStore(services.db)))
    return 0


def _dead_letters(services: Any = None) -> Any:
    from sluice.ops.deadletters import DeadLetters

    return DeadLetters(services or _services())


def cmd_dlq_list(args: argparse.Namespace) -> int:
    dlq = _dead_letters()
    if args.name is None:
        _print({"queues": dlq.overview()})
        return 0
    emit(dlq.list_letters(args.name, args.limit), lambda result: [
        f"{result['queue']}: {result['depth']} dead letter(s)",
        *(f"  {item['id']}  {item['failedAt'] or '?'}  {age(item['ageSeconds'])} old  "
          f"{item['reason'][:120]}" for item in result["items"])])
    return 0


def cmd_dlq_show(args: argparse.Namespace) -> int:
    _print(_dead_letters().show(args.name, args.id))
    return 0


def cmd_dlq_redrive(args: argparse.Namespace) -> int:
    services = _services()
    with audited(services, _actor(), "dlq:redrive", f"dlq:{args.name}") as record:
        result = _dead_letters(services).redrive(args.name, ids=args.id or None, limit=args.limit,
                                         dry_run=args.dry_run, actor=_actor())
        record.update(outcome="dry_run" if args.dry_run else f"redriven={result['count']}")
    _print(result)
    return 2 if result["failed"] or result["refused"] else 0


def cmd_dlq_purge(args: argparse.Namespace) -> int:
    if not args.id and not args.all:
        raise RequestError("give --id ID (repeatable) or --all")
    services = _services()
    with audited(services, _actor(), "dlq:purge", f"dlq:{args.name}") as record:
        result = _dead_letters(services).purge(args.name, ids=args.id or None, actor=_actor())
        record["outcome"] = f"purged={result['purged']}"
    _print(result)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("sign", help="sign a JSON message read on stdin and print it")
    p.set_defaults(func=cmd_sign)

    p = sub.add_parser("verify", help="exit 0 if the JSON message on stdin is validly signed")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("publish", help="publish a message to TOPIC (JSON fields on stdin)")
    p.add_argument("topic")
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("flags", help="show flags, or set one: sluice flags KEY on|off")
    p.add_argument("key", nargs="?")
    p.add_argument("value", nargs="?", choices=["on", "off"])
    p.add_argument("--tenant", help="a per-tenant override for this tenant scope id (refused, exit 64, for a flag read only globally; --clear still removes one)")
    p.add_argument("--clear", action="store_true", help="remove the tenant's override")
    p.set_defaults(func=cmd_flags)

    dlq = sub.add_parser("dlq", help="read, redrive and purge dead letters").add_subparsers(
        dest="dlq_command", required=True)
    p = dlq.add_parser("list", help="every DLQ's depth, or one DLQ's dead letters, newest first")
    p.add_argument("name", nargs="?", help="rss.ingest, rss.enrich, …, quarantine, ledger or delivery")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_dlq_list)
    p = dlq.add_parser("show", help="one dead letter in full")
    p.add_argument("name")
    p.add_argument("id")
    p.set_defaults(func=cmd_dlq_show)
    p = dlq.add_parser("redrive", help="put dead letters back (only what verifies; re-signed); audited")
    p.add_argument("name")
    p.add_argument("--id", action="append", help="a dead letter id (repeatable)")
    p.add_argument("--limit", type=int, default=10, help="at most this many (max 100)")
    p.add_argument("--dry-run", action="store_true", help="say what would be redriven")
    p.set_defaults(func=cmd_dlq_redrive)
    p = dlq.add_parser("purge", help="delete dead letters; audited")
    p.add_argument("name")
    p.add_argument("--id", action="append")
    p.add_argument("--all", action="store_true")
    p.set_defaults(func=cmd_dlq_purge)
