"""The ``sluice`` command line.

Feature modules add subcommands through ``COMMAND_MODULES``: each module has
``register(subparsers)`` that adds its parsers with ``func=`` set.

Exit codes (docs/cli.md): 0 done; 1 error (the run errored, a store or
provider failed); 2 the command ran and reported failures; 64 usage (bad
arguments, an unknown job, topic, flag, channel or id, invalid input, a refused
state change); 78 configuration (a setting is missing or invalid, or no database).

How commands print (``--json``, quiet stderr, ``-v``) lives in ``sluice.cli.output``.
"""

from __future__ import annotations

import argparse
import getpass
import importlib
import json
import re
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn, Protocol

from sluice.cli.output import (
    InternalError,
    Mode,
    check_database,
    emit,
    failed,
    mode,
    note,
    speaking,
    terminal,
    terminal_safe,
)
from sluice.core.errors import ConfigurationError, RequestError, SluiceError
from sluice.core.times import iso_z
from sluice.core.validate import actor_name

# Feature command modules, each with register(subparsers).
COMMAND_MODULES: list[str] = ["sluice.cli.erasure", "sluice.cli.queues", "sluice.cli.delivery",
                              "sluice.cli.billing", "sluice.cli.token", "sluice.cli.rss",
                              "sluice.cli.alerts", "sluice.cli.audit", "sluice.cli.schedule",
                              "sluice.cli.deploy", "sluice.cli.packs"]

EXIT_OK, EXIT_ERROR, EXIT_FAILURES, EXIT_USAGE, EXIT_CONFIG = 0, 1, 2, 64, 78
# Commands that may create the SQLite database; every other one refuses a missing file.
CREATES_DATABASE = frozenset({"migrate", "dev"})
# Commands that print no data (a server), so they take no --json.
NO_JSON = frozenset({"dev"})


class UsageError(RequestError):
    """The command line is not one this command takes."""

    code = "usage"

    def __init__(self, message: str, *, prog: str, usage: str) -> None:
        # The argument argparse names ("argument --limit: ..."), as the API names a field.
        named = re.match(r"argument ([^:]+):|the following arguments are required: ([^,]+)",
                         message)
        field = (named.group(1) or named.group(2)).split("/")[-1] if named else None
        super().__init__(message, **({"field": field} if field else {}))
        self.prog = prog
        self.usage = usage


class Parser(argparse.ArgumentParser):
    """argparse whose errors are a ``UsageError`` (exit 64, argparse's own is 2), so ``main``
    reports them like every other error, as JSON too with ``--json``."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, prog=self.prog, usage=self.format_usage())


class ShowVersion(argparse.Action):
    """``--version``: looked up only when asked (reading every distribution's metadata)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(installed_version())
        parser.exit()


def installed_version() -> str:
    """The name and version of the installed distribution that provides the ``sluice``
    package, whatever that distribution is called."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    package = (__package__ or "sluice").partition(".")[0]  # __name__ is __main__ under -m
    for name in dict.fromkeys(packages_distributions().get(package, [])):
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:  # metadata listed but unreadable: try the next one
            continue
    return f"{package} (not installed: no distribution provides the {package} package)"


def exit_code(exc: SluiceError) -> int:
    if isinstance(exc, RequestError):
        return EXIT_USAGE
    if isinstance(exc, ConfigurationError):
        return EXIT_CONFIG
    return EXIT_ERROR


def operator(by: str | None = None) -> str:
    """Who an admin action from the command line is audited as: ``--by``, else ``cli:$USER``
    (as ``actor_name`` stores a name)."""
    if by:
        name = actor_name(by)
        if not name:
            raise RequestError("--by must name the operator with a printable character",
                               field="--by")
        return name
    try:
        return actor_name(f"cli:{getpass.getuser()}")
    except (KeyError, OSError):  # no user name in a bare container
        return "cli:unknown"


class AddCommand(Protocol):
    def __call__(self, command: str, func: Any, help: str, *, by: bool = True
                 ) -> argparse.ArgumentParser: ...


def command_group(sub: Any, name: str, help: str) -> AddCommand:
    """``sluice NAME …``: returns ``add(command, func, help, by=True)`` for its subcommands,
    each with ``--json``; those that write an audit row (``by=True``) also take ``--by`` (the
    operator named in it). A read takes no ``--by``: an option that does nothing is refused."""
    commands = sub.add_parser(name, help=help).add_subparsers(dest=f"{name}_command",
                                                              required=True)

    def add(command: str, func: Any, help: str, *, by: bool = True
            ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = commands.add_parser(command, help=help)
        p.add_argument("--json", action="store_true", help="print JSON on stdout")
        if by:
            p.add_argument("--by", help="operator name for the audit trail (default cli:$USER)")
        p.set_defaults(func=func)
        return p

    return add


@contextmanager
def audited(services: Any, actor: str, action: str, target: str | None,
            detail: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """An operator's action, audited like the API's: the row is written (outcome
    ``started``) before the block runs and settled after it with ``record["outcome"]``
    (default ``ok``), ``record["detail"]`` and ``record["target"]``, or the error's code.
    ``record["id"]`` is the row's id (an action may write its progress into it)."""
    from sluice.jobs.runs import RunStore

    runs = RunStore(services.db)
    audit_id = runs.audit(actor=actor, action=action, target=target, outcome="started",
                          ip=None, detail=detail)
    record: dict[str, Any] = {"outcome": "ok", "detail": detail, "target": None, "id": audit_id}
    try:
        yield record
    except SluiceError as exc:
        runs.complete_audit(audit_id, exc.code, record["detail"], record["target"])
        raise
    runs.complete_audit(audit_id, str(record["outcome"]), record["detail"], record["target"])


def services(*, migrate_embedded: bool = True) -> Any:
    """The process's ``Services``; on the embedded SQLite default, pending migrations first."""
    return _services(argparse.Namespace(), migrate_embedded=migrate_embedded)


def _services(args: argparse.Namespace, *, migrate_embedded: bool = False) -> Any:
    from sluice.core.services import Services
    from sluice.core.settings import Settings

    settings = Settings.from_env()
    shown = check_database(settings.database_url,
                           may_create=mode().command in CREATES_DATABASE)
    if not mode().json and mode().command != "dev":  # dev's banner names it
        print(f"database: {shown}", file=sys.stderr)
    services = Services.from_settings(settings)
    if migrate_embedded and services.db.dialect == "sqlite":
        from sluice.store.migrate import migrate

        for migration in migrate(services.db):
            note(f"applied migration {migration.version} {migration.name}")
    return services


def progress_line() -> Any:
    """A one-line progress indicator on a terminal; silent otherwise."""
    if not sys.stderr.isatty():
        return None
    started = time.monotonic()

    def show(message: str) -> None:
        # The line's own erase sequence goes to the terminal; the message is guarded.
        terminal().write(f"\r\x1b[2K[{time.monotonic() - started:6.1f}s] ")
        sys.stderr.write(message)
        sys.stderr.flush()

    return show


def cmd_run(args: argparse.Namespace) -> int:
    from sluice.jobs.registry import get_job

    return run_and_print(get_job(args.job), _services(args, migrate_embedded=True),
                         as_json=args.json)


def run_and_print(job: Any, services: Any, *, as_json: bool) -> int:
    """Run ``job`` now (with a progress line on a terminal), print its result, and answer
    the exit code its outcome means."""
    from sluice.jobs.runner import run_job

    progress = progress_line()
    if progress:
        progress(f"running {job.name}…")
    outcome = run_job(job, services, "cli", progress=progress)
    if progress:
        terminal().write("\r\x1b[2K")
    emit(outcome.body, lambda body: [f"{job.name}: {outcome.outcome}", *(
        f"  {key}: {json.dumps(value, ensure_ascii=False)}" for key, value in body.items())])
    return {"ok": EXIT_OK, "skipped": EXIT_OK, "failures": EXIT_FAILURES}.get(outcome.outcome,
                                                                             EXIT_ERROR)


def cmd_migrate(args: argparse.Namespace) -> int:
    from sluice.store.migrate import migrate, pending

    services = _services(args)
    if args.dry_run:
        waiting = [{"version": m.version, "name": m.name} for m in pending(services.db)]
        emit({"dialect": services.db.dialect, "pending": waiting},
             lambda body: [f"pending {m['version']} {m['name']}" for m in body["pending"]])
        return 0
    applied = [{"version": m.version, "name": m.name} for m in migrate(services.db)]
    emit({"dialect": services.db.dialect, "applied": applied},
         lambda body: [*(f"applied {m['version']} {m['name']}" for m in body["applied"]),
                       f"{len(body['applied'])} migration(s) applied on {body['dialect']}"])
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    if args.why:
        return cmd_job_why(args)
    from sluice.jobs.overdue import statuses
    from sluice.jobs.registry import JOBS
    from sluice.jobs.runs import RunStore
    from sluice.jobs.schedule import job_schedules
    from sluice.store.db import utcnow

    services = _services(args, migrate_embedded=True)
    schedules = job_schedules(JOBS)
    last = RunStore(services.db).last_runs()
    states = statuses(services.db, utcnow())
    rows = []
    for job in JOBS.values():
        run = last.get(job.name)
        rows.append({
            "job": job.name, "route": job.route,
            "schedule": ", ".join(schedules[job.name]),
            "lastRun": iso_z(run["started_at"]) if run else None,
            "lastOutcome": run["outcome"] if run else None,
            **states[job.name],
        })
    emit(rows, lambda rows: [line for row in rows for line in _job_lines(row)])
    return 0


def cmd_job_why(args: argparse.Namespace) -> int:
    from sluice.jobs.registry import get_job

    if not args.job:
        raise RequestError("sluice jobs why JOB: name the job (sluice jobs lists them)",
                           field="job")
    from sluice.jobs.why import job_why
    from sluice.store.db import utcnow

    services = _services(args, migrate_embedded=True)
    emit(job_why(services.db, get_job(args.job), utcnow()), lambda body: [body["sentence"]])
    return 0


def _job_lines(row: dict[str, Any]) -> list[str]:
    head = (f"{row['job']:<16} {row['schedule']:<24} {row['state']:<8} last: "
            f"{row['lastOutcome'] or 'never'}"
            f"{' at ' + row['lastRun'] if row['lastRun'] else ''}  {row['route']}")
    lines = [head]
    if row["state"] == "overdue":
        lines.append(f"  overdue: expected by {row['expectedRunAt']}, last scheduled run "
                     f"{row['lastScheduledRunAt']} (paged after {row['overdueAt']})")
    if row["disabled"]:
        mark = row["disabled"]
        lines.append(f"  disabled on purpose by {mark['by']} at {mark['at']}: {mark['reason']}")
    return lines


def cmd_queues(args: argparse.Namespace) -> int:
    from sluice.ops.overview import queue_figures

    emit(queue_figures(_services(args, migrate_embedded=True)), _queue_lines)
    return 0


def _queue_lines(data: dict[str, Any]) -> Iterator[str]:
    for section, figures in data.items():
        if section in ("generatedAt", "jobs"):
            continue
        if isinstance(figures, list):
            for item in figures:
                yield (f"{section:<15} {item.get('topic', ''):<15} "
                       f"queue={json.dumps(item['queue'], ensure_ascii=False)} "
                       f"dlq={json.dumps(item['dlq'], ensure_ascii=False)}")
        else:
            yield f"{section:<15} {json.dumps(figures, ensure_ascii=False)}"


def cmd_dev(args: argparse.Namespace) -> int:
    from sluice.cli.dev import serve

    services = _services(args, migrate_embedded=True)
    serve(services, host=args.host, port=args.port, scheduler=not args.no_scheduler,
          verbose=mode().verbose)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sluice", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="logs and metrics on stderr (-vv: debug)")
    parser.add_argument("--version", action=ShowVersion, nargs=0,
                        help="print the installed distribution's name and version")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("dev", help="serve the app locally and fire jobs on their schedules")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8787)
    p.add_argument("--no-scheduler", action="store_true", help="serve only; fire no jobs")
    p.set_defaults(func=cmd_dev)

    p = sub.add_parser("run", help="run one job now and print its result")
    p.add_argument("job")
    p.add_argument("--json", action="store_true", help="print the result object alone on stdout")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("migrate", help="apply pending schema migrations")
    p.add_argument("--dry-run", action="store_true", help="list pending migrations only")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("jobs", help="list jobs with their schedules and last runs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_jobs)
    # sluice jobs why JOB: why one job is overdue or not running (``jobs`` stays a command)
    p.add_argument("why", nargs="?", choices=["why"],
                   help="why JOB is overdue or not running, in one sentence")
    p.add_argument("job", nargs="?", help="the job `why` asks about")

    p = sub.add_parser("queues", help="real figures for every queue, outbox and dead-letter list")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_queues)

    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    from sluice.cli.packs import leave_out

    leave_out(sub)  # the commands of the packs this deployment leaves out
    for path, leaf in leaf_commands(parser).items():
        options = {o for action in leaf._actions for o in action.option_strings}
        if "--json" not in options and path[0] not in NO_JSON:
            leaf.add_argument("--json", action="store_true", help="print JSON on stdout")
        if "-v" not in options:
            leaf.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                              help="logs and metrics on stderr (-vv: debug)")
    return parser


def leaf_commands(parser: argparse.ArgumentParser) -> dict[tuple[str, ...],
                                                            argparse.ArgumentParser]:
    """Every runnable command (``("dlq", "list")`` …), read from the parser itself."""
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found[path] = p
        for action in subs:
            for name, child in action.choices.items():
                walk(child, (*path, name))

    walk(parser, ())
    return found


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        # Not parsed, so --json is read from the words given.
        with speaking(Mode(json="--json" in argv)):
            failed(exc, exc.usage + terminal_safe(f"{exc.prog}: error: {exc.message}"))
        return EXIT_USAGE
    with speaking(Mode(json=bool(getattr(args, "json", False)), verbose=args.verbose,
                       command=args.command)):
        try:
            code: int = args.func(args)
            return code
        except SluiceError as exc:
            failed(exc, f"sluice: {exc.code}: {exc.message}")
            return exit_code(exc)
        except Exception as exc:
            if not mode().json:
                raise  # a defect: Python's own traceback and exit 1
            traceback.print_exc()
            failed(InternalError(f"{type(exc).__name__}: {exc}"), "sluice: internal_error")
            return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
