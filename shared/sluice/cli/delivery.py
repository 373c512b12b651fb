"""``sluice delivery …``: read, redrive, purge and enqueue delivery queue entries, settle
the ones resting ``unknown`` (``mark-delivered``, ``send-again``), replay a destination's
window (``replay``), and show the destinations (``destinations``) and their flow control
(``destination pause|resume|disable|enable|rate DEST``, ``--dry-run`` for the preview).

Redrive, purge, mark-delivered, send-again, replay and every destination change (not their
dry runs) are written to ``admin_audit`` as the operator (``--by``, else ``cli:$USER``),
like the API's admin actions: a destination change under the API's action name and target
(``delivery:destination_pause``, ``/api/admin/delivery/destinations/<key>``), with what it
changed and until when in ``detail``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from sluice.cli.main import audited, command_group, operator, services
from sluice.cli.output import emit, human_lines
from sluice.core.errors import RequestError
from sluice.core.validate import load_json

EXIT_OK, EXIT_FAILED = 0, 2


def _services() -> Any:
    return services()


def _store(services: Any) -> Any:
    from sluice.delivery.store import DeliveryStore

    return DeliveryStore(services.db)


def _operator(args: argparse.Namespace) -> str:
    return operator(args.by)


def _print(args: argparse.Namespace, body: Any) -> None:
    emit(body, _lines)


def _lines(body: Any) -> Iterator[str]:
    for row in body if isinstance(body, list) else [body]:
        if "recipient" not in row:
            yield from human_lines(row)
            continue
        when = {"acked": ("acked_at", row["ackedAt"]), "failed": ("failed_at", row["failedAt"]),
                "in_flight": ("lease_until", row["leaseUntil"]),
                "unknown": ("updated_at", row["updatedAt"])}.get(
            row["status"], ("next", row["nextAttemptAt"]))
        yield (f"{row['id']}  {row['status']:<9}  {row['channel']:<8}  to={row['recipient']}  "
               f"attempts={row['attempts']}  {when[0]}={when[1]}")
        if row.get("lastError"):
            yield f"  last error: {row['lastError']}"
        if row["status"] == "unknown":
            yield (f"  sent {row['unknownSends']} time(s) without an answer: it may have "
                   f"arrived. `sluice delivery mark-delivered {row['id']}` if the receiver "
                   f"has it, `sluice delivery send-again {row['id']}` if not, or purge it")


def cmd_list(args: argparse.Namespace) -> int:
    from sluice.delivery.store import check_status

    rows = _store(_services()).list(status=check_status(args.status), channel=args.channel,
                                    destination=args.destination, limit=args.limit)
    _print(args, [row.to_json() for row in rows])
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    _print(args, _store(_services()).get(args.id).to_json())
    return EXIT_OK


def cmd_why(args: argparse.Namespace) -> int:
    from sluice.delivery.why import why

    emit(why(_services(), args.id).to_json(), lambda body: [body["sentence"]])
    return EXIT_OK


def cmd_stats(args: argparse.Namespace) -> int:
    _print(args, {"statuses": _store(_services()).stats()})
    return EXIT_OK


def cmd_redrive(args: argparse.Namespace) -> int:
    services = _services()
    if args.all_failed:
        with audited(services, _operator(args), "delivery:redrive_all",
                     args.channel or "*",
                     {"destination": args.destination} if args.destination else None) as record:
            count = _store(services).redrive_all(channel=args.channel,
                                                 destination=args.destination)
            record["outcome"] = f"redriven={count}"
        _print(args, {"redriven": count})
    else:
        with audited(services, _operator(args), "delivery:redrive", _one_id(args)) as record:
            entry = _store(services).redrive(_one_id(args))
            record["outcome"] = "redriven"
        _print(args, entry.to_json())
    return EXIT_OK


def cmd_purge(args: argparse.Namespace) -> int:
    services = _services()
    if args.all_failed:
        with audited(services, _operator(args), "delivery:purge_all",
                     args.channel or "*") as record:
            count = _store(services).purge_all(channel=args.channel)
            record["outcome"] = f"purged={count}"
    else:
        with audited(services, _operator(args), "delivery:purge", _one_id(args)) as record:
            _store(services).purge(_one_id(args))
            record["outcome"] = "purged"
        count = 1
    _print(args, {"purged": count})
    return EXIT_OK


def cmd_settle_unknown(args: argparse.Namespace) -> int:
    services = _services()
    action = "mark_delivered" if args.command_name == "mark-delivered" else "send_again"
    with audited(services, _operator(args), f"delivery:{action}", args.id) as record:
        entry = getattr(_store(services), action)(args.id)
        record["outcome"] = entry.status.value
    _print(args, entry.to_json())
    return EXIT_OK


def cmd_replay(args: argparse.Namespace) -> int:
    from sluice.delivery.channels import Outbound, channels
    from sluice.delivery.replay import AuditRow, Replay, parse_filter
    from sluice.jobs.runs import RunStore

    flt = parse_filter({"destination": args.destination, "channel": args.channel,
                        "since": args.since, "until": args.until, "status": args.status,
                        "after": args.after}, channels=list(channels()))
    if args.dry_run and args.by:
        raise RequestError("--by names the operator in the audit row, and a dry run writes "
                           "none: leave one of them out", field="--by")
    services = _services()
    with Outbound.open(services.settings) as client:
        replay = Replay.from_services(services, client)
        if args.dry_run:
            report = replay.run(flt, dry_run=True)
        else:
            with audited(services, _operator(args), "delivery:replay", flt.destination,
                         {"filter": flt.to_json()}) as record:
                report = replay.run(flt, dry_run=False,
                                    audit=AuditRow(RunStore(services.db), record["id"]),
                                    progress=lambda done: record.update(detail=done.to_json()))
                record["outcome"] = f"replayed={report.count}"
    emit(report.to_json(), _replay_lines)
    return EXIT_OK


def _replay_lines(body: Any) -> Iterator[str]:
    flt, window = body["filter"], body["window"]
    verb = "would replay" if body["dryRun"] else "replayed"
    yield (f"{verb} {body['count']} {flt['status']} entries of {flt['destination']} "
           f"enqueued from {flt['since']} until {flt['until']}")
    yield (f"  in the window: {window['failed']} failed ({window['expired']} expired), "
           f"{window['acked']} acked, {window['unknown']} unknown")
    yield (f"  already acknowledged by the receiver: {body['alreadyAcknowledged']} "
           f"({body['skippedAcknowledged']} of them left out: replay acked ones with "
           f"--status acked)" if body["skippedAcknowledged"] else
           f"  already acknowledged by the receiver: {body['alreadyAcknowledged']}")
    if body["noAdapter"]:
        yield (f"  {body['noAdapter']} entries of channels without an adapter: their "
               "destinations are not known")
    if body["changedMeanwhile"]:
        yield f"  {body['changedMeanwhile']} changed meanwhile (not replayed)"
    if not body["dryRun"]:
        yield "  the drain sends them (sluice run delivery-drain to send now)"


def cmd_destinations(args: argparse.Namespace) -> int:
    from sluice.ops.destinations import parse_page, view

    page = parse_page({"state": args.state, "after": args.after,
                       "limit": None if args.limit is None else str(args.limit)})
    emit(view(_services(), page), _destinations_page)
    return EXIT_OK


def _destinations_page(body: Any) -> Iterator[str]:
    yield from _destination_lines(body["destinations"])
    if body["next"]:
        yield f"(more: sluice delivery destinations --after {body['next']})"


def _destination_lines(body: Any) -> Iterator[str]:
    rows = body if isinstance(body, list) else [body]
    if not rows:
        yield "(no destinations known yet)"
    for row in rows:
        state = row["state"] + (f" since {row['since']}" if row["since"] else "") + (
            f" until {row['until']}" if row["until"] else "")
        rates = ", ".join(f"{r['limit']:g}/{r['per']}" + (" override" if r["until"] else "")
                          for r in row["rates"]) or "none"
        yield (f"{row['key']}  {state}  waiting={row['waiting']}  in_flight={row['inFlight']}"
               f"  failed={row['failed']}  last_success={row['lastSuccess'] or '-'}"
               f"  rates={rates}")
        if row["disabled"]:
            yield f"  disabled: {row['disabled']['reason']}"
        if row["lastError"]:
            yield f"  last error: {row['lastError']}"


def cmd_destination(args: argparse.Namespace) -> int:
    from sluice.ops.destinations import apply, parse_change, preview

    body: dict[str, Any] = {name: value for name, value in (
        ("until", args.until), ("reason", args.reason), ("limit", args.limit),
        ("per", args.per), ("clear", True if args.clear else None)) if value is not None}
    change = parse_change(args.action, args.destination, body)
    services = _services()
    if args.dry_run:
        if args.by:
            raise RequestError("--by names who made a change; a --dry-run makes none",
                               field="--by")
        emit(preview(services, change), human_lines)
        return EXIT_OK
    with audited(services, _operator(args), f"delivery:destination_{args.action}",
                 f"/api/admin/delivery/destinations/{change.destination}",
                 {"change": change.to_json()}) as record:
        answer = apply(services, change)
        record["outcome"] = f"{args.action}: moved={answer['moved']}"
    emit(answer, human_lines)
    return EXIT_OK


def _one_id(args: argparse.Namespace) -> str:
    if not args.id:
        raise RequestError("give an entry ID, or --all-failed")
    return str(args.id)


def cmd_enqueue(args: argparse.Namespace) -> int:
    from sluice.core.settings import Settings
    from sluice.delivery.channels import Outbound
    from sluice.delivery.drain import Deliverer, SendOutcome
    from sluice.ops.door import admit

    if (args.text is None) == (args.payload is None):
        raise RequestError("give exactly one of --text and --payload")
    payload = load_json(args.payload, field="--payload") if args.payload is not None \
        else {"text": args.text}
    if args.subject_line:
        if not isinstance(payload, dict):
            raise RequestError("--payload must be a JSON object")
        payload["subject"] = args.subject_line
    checked = admit("enqueue_delivery", {
        "channel": args.channel, "recipient": args.recipient, "payload": payload,
        "idempotencyKey": args.key, "subjectUserId": args.user}, Settings.from_env())
    args.recipient, args.key, args.user = (checked["recipient"], checked["idempotencyKey"],
                                           checked["subjectUserId"])
    services = _services()
    if not args.send:
        entry, _ = _store(services).enqueue(args.channel, args.recipient, payload,
                                                  idempotency_key=args.key,
                                                  subject_user_id=args.user)
        _print(args, entry.to_json())
        return EXIT_OK
    with Outbound.open(services.settings) as client:
        deliverer = Deliverer.from_services(services, client)
        entry, outcome = deliverer.deliver(args.channel, args.recipient, payload,
                                           idempotency_key=args.key, subject_user_id=args.user)
    _print(args, entry.to_json())
    waiting = (None, SendOutcome.ACKED, SendOutcome.RETRY, SendOutcome.UNKNOWN,
               SendOutcome.UNCONFIGURED, SendOutcome.PAUSED, SendOutcome.WAITING,
               SendOutcome.RATE_LIMITED)
    return EXIT_OK if outcome in waiting else EXIT_FAILED


def register(sub: Any) -> None:
    add = command_group(sub, "delivery", "the delivery queue: list, show, redrive, purge")

    p = add("list", cmd_list, "list entries, newest first", by=False)
    p.add_argument("--status", choices=["pending", "in_flight", "acked", "failed", "unknown"])
    p.add_argument("--channel")
    p.add_argument("--destination", help="a destination's key (sluice delivery destinations)")
    p.add_argument("--limit", type=int, default=100)
    add("show", cmd_show, "show one entry", by=False).add_argument("id")
    add("why", cmd_why, "what holds one entry, and until when, in one sentence",
        by=False).add_argument("id")
    add("stats", cmd_stats, "count and oldest entry per status", by=False)
    for name, func, what in (("redrive", cmd_redrive, "failed entries back to pending"),
                             ("purge", cmd_purge, "delete failed entries")):
        p = add(name, func, f"{what}: one ID, or --all-failed [--channel C]"
                + (" [--destination D]" if name == "redrive" else ""))
        p.add_argument("id", nargs="?")
        p.add_argument("--all-failed", action="store_true")
        p.add_argument("--channel")
        if name == "redrive":
            p.add_argument("--destination", help="only the failed entries of this destination")
    for name, what in (("mark-delivered", "the receiver has it: acked"),
                       ("send-again", "the receiver does not have it: pending, attempts reset")):
        p = add(name, cmd_settle_unknown, f"an entry resting unknown: {what}")
        p.add_argument("id")
        p.set_defaults(command_name=name)
    from sluice.delivery.replay import STATUSES

    p = add("replay", cmd_replay, "a destination's window sent again: its entries of one "
            "status made due for the drain, afresh (audited)")
    p.add_argument("--destination", required=True,
                   help="a destination's key (webhook:URL, telegram:CHAT, slack:CHANNEL, "
                        "email:ADDRESS) or a receiver's (webhook:HOST:PORT, the port always "
                        "written: 443, 80; email:smtp)")
    p.add_argument("--channel", help="only this channel's entries")
    p.add_argument("--since", required=True, help="ISO 8601 with offset (2026-12-01T10:00Z)")
    p.add_argument("--until", help="ISO 8601 with offset (default now; at most 31 days)")
    p.add_argument("--status", choices=STATUSES,
                   help="what to replay (default failed; acked ones only when asked)")
    p.add_argument("--after", help="an entry's id: of the entries enqueued at --since, only "
                                   "those after it (a replay's next.after)")
    p.add_argument("--dry-run", action="store_true",
                   help="count what would go and what the receiver already has")
    _register_destinations(add)
    p = add("enqueue", cmd_enqueue, "store a delivery (and with --send, send it now)",
            by=False)
    from sluice.delivery.channels import channels

    p.add_argument("channel", choices=list(channels()))
    p.add_argument("recipient", help="URL, Slack channel, Telegram chat id or email address")
    p.add_argument("--text")
    p.add_argument("--payload", help="the whole payload as a JSON object")
    p.add_argument("--subject-line", help="email subject")
    p.add_argument("--key", help="idempotency key (a second enqueue returns the first)")
    p.add_argument("--user", help="the app user the message is for (for erasure)")
    p.add_argument("--send", action="store_true", help="send now (inline path), then settle")


def _register_destinations(add: Any) -> None:
    from sluice.ops.destinations import ACTIONS, DEFAULT_LIMIT, MAX_LIMIT, STATES

    p = add("destinations", cmd_destinations,
            "every destination: its state, entries waiting, last error and success, rates",
            by=False)
    p.add_argument("--state", choices=STATES)
    p.add_argument("--limit", type=int, help=f"at most this many (1 to {MAX_LIMIT}, "
                                             f"default {DEFAULT_LIMIT})")
    p.add_argument("--after", help="the key a page ends with: the next page")
    p = add("destination", cmd_destination,
            "change one destination: " + "; ".join(f"{a.name}: {a.help}"
                                                   for a in ACTIONS.values()))
    p.add_argument("action", choices=list(ACTIONS))
    p.add_argument("destination", help="its key, as `sluice delivery destinations` shows it")
    p.add_argument("--until", help="pause, rate: an ISO 8601 time with its offset "
                                   "(2026-12-01T10:00:00Z), at most 30 days ahead")
    p.add_argument("--reason", help="pause, disable: why (kept with it)")
    p.add_argument("--limit", type=float, help="rate: messages per --per")
    p.add_argument("--per", choices=["second", "minute"], help="rate: the period of --limit")
    p.add_argument("--clear", action="store_true", help="rate: end the override now")
    p.add_argument("--dry-run", action="store_true",
                   help="only show what it would do (nothing changed, nothing audited)")
