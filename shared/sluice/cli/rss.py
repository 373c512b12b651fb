"""``sluice rss …``: feed sources, tenant scopes, a scope's stories, and the tick.

Writes are recorded in ``admin_audit`` as the operator (``--by``, else ``cli:$USER``).
"""

from __future__ import annotations

import argparse
from typing import Any

from sluice.cli.main import EXIT_OK, command_group, operator, run_and_print, services
from sluice.cli.output import emit


def _audit(svc: Any, args: argparse.Namespace, action: str, target: str, outcome: str) -> None:
    from sluice.jobs.runs import RunStore

    RunStore(svc.db).audit(actor=operator(args.by), action=action, target=target,
                           outcome=outcome, ip=None, detail=None)


def _store(svc: Any) -> Any:
    from sluice.rss.store import RssStore

    return RssStore(svc.db)


def _print(args: argparse.Namespace, body: Any, line: Any = None) -> None:
    emit(body, None if line is None else lambda body: [
        line(row) for row in (body if isinstance(body, list) else [body])])


def _source_line(row: dict[str, Any]) -> str:
    state = row["fetchState"]
    health = (f"failing x{state['consecutiveFailures']} ({state['lastError']}), next "
              f"{state['nextAttemptAt']}" if state["consecutiveFailures"]
              else f"ok {state['lastSuccessAt'] or 'never fetched'}")
    return (f"{row['id']}  {'global ' if row['global'] else ''}{row['url']}"
            f"{'  ' + repr(row['title']) if row['title'] else ''}  {health}")


def _scope_line(row: dict[str, Any]) -> str:
    return (f"{row['scopeId']}  tenant={row['tenantId']}  locale={row['locale']}  "
            f"sources={len(row['sourceIds'])}  {'completed' if row['completed'] else 'pending'}"
            f"  refreshed={row['lastRefreshedAt'] or 'never'}")


def cmd_source_add(args: argparse.Namespace) -> int:
    from sluice.rss.admin import add_source

    svc = services()
    body: dict[str, Any] = {"url": args.url, "global": args.glob}
    if args.title:
        body["title"] = args.title
    source = add_source(svc, body)
    _audit(svc, args, "rss:source_add", source.id, "added")
    _print(args, source.to_json(), _source_line)
    return EXIT_OK


def cmd_source_list(args: argparse.Namespace) -> int:
    _print(args, [s.to_json() for s in _store(services()).sources()], _source_line)
    return EXIT_OK


def cmd_source_show(args: argparse.Namespace) -> int:
    _print(args, _store(services()).source(args.id).to_json())
    return EXIT_OK


def cmd_source_remove(args: argparse.Namespace) -> int:
    svc = services()
    _store(svc).remove_source(args.id)
    _audit(svc, args, "rss:source_remove", args.id, "removed")
    _print(args, {"removed": args.id})
    return EXIT_OK


def cmd_scope_set(args: argparse.Namespace) -> int:
    from sluice.rss.admin import put_scope

    svc = services()
    scope = put_scope(svc, args.scope, {"tenantId": args.tenant, "sourceIds": args.source,
                                        "locale": args.locale,
                                        "completed": not args.incomplete})
    _audit(svc, args, "rss:scope_set", scope.scope_id, "set")
    _print(args, scope.to_json(), _scope_line)
    return EXIT_OK


def cmd_scope_list(args: argparse.Namespace) -> int:
    _print(args, [s.to_json() for s in _store(services()).scopes()], _scope_line)
    return EXIT_OK


def cmd_scope_show(args: argparse.Namespace) -> int:
    _print(args, _store(services()).scope(args.scope).to_json())
    return EXIT_OK


def cmd_scope_remove(args: argparse.Namespace) -> int:
    svc = services()
    _store(svc).remove_scope(args.scope)
    _audit(svc, args, "rss:scope_remove", args.scope, "removed")
    _print(args, {"removed": args.scope})
    return EXIT_OK


def cmd_stories(args: argparse.Namespace) -> int:
    from sluice.rss.admin import scope_stories_body

    emit(scope_stories_body(services(), args.scope, str(args.limit)), lambda body: [
        (f"{body['scopeId']}: built {body['builtAt'] or 'never (no build yet)'}, "
         f"{len(body['stories'])} stories"),
        *(f"  {story['publishedAt'] or '-':<25}  {story['title']}  {story['link'] or ''}"
          for story in body["stories"])])
    return EXIT_OK


def cmd_refresh(args: argparse.Namespace) -> int:
    from sluice.jobs.registry import get_job

    return run_and_print(get_job("rss-refresh"), services(), as_json=args.json)


def register(sub: Any) -> None:
    rss = sub.add_parser("rss", help="RSS ingestion: sources, scopes, stories, the tick")
    groups = rss.add_subparsers(dest="rss_command", required=True)

    add = command_group(groups, "sources", "feed sources and their fetch state")
    p = add("add", cmd_source_add, "add a feed source")
    p.add_argument("url")
    p.add_argument("--title")
    p.add_argument("--global", dest="glob", action="store_true",
                   help="part of the global catalog")
    add("list", cmd_source_list, "list sources with their fetch state", by=False)
    add("show", cmd_source_show, "show one source", by=False).add_argument("id")
    add("remove", cmd_source_remove, "remove a source no scope uses").add_argument("id")

    add = command_group(groups, "scopes", "tenant scopes: a tenant's source set and locale")
    p = add("set", cmd_scope_set, "create or replace a scope")
    p.add_argument("scope")
    p.add_argument("--tenant", required=True)
    p.add_argument("--source", action="append", required=True, help="a source id (repeat)")
    p.add_argument("--locale", required=True)
    p.add_argument("--incomplete", action="store_true", help="not yet ingested by the tick")
    add("list", cmd_scope_list, "list scopes", by=False)
    add("show", cmd_scope_show, "show one scope", by=False).add_argument("scope")
    add("remove", cmd_scope_remove, "remove a scope").add_argument("scope")

    for name, func, help_text in (
            ("stories", cmd_stories, "the stories of a scope's stored build (never builds)"),
            ("refresh", cmd_refresh, "run the rss-refresh tick now")):
        p = groups.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="print JSON on stdout")
        p.set_defaults(func=func)
        if name == "stories":
            p.add_argument("scope")
            p.add_argument("--limit", type=int, default=50)
