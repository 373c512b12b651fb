"""``sluice dev``: the app on 127.0.0.1 and a scheduler firing every job (those of Sluice's
core and of the packs that are on, and the app's: ``sluice.core.extensions``) on its table
entry's schedule.

What it prints is for a person: the banner (what is configured, each job's next run), then
one line per job run it fires on stdout, and on stderr one line per warning or error. The
structured logs, their tracebacks, the metric blobs and uvicorn's request lines come with
``-v`` (``-vv``: debug), as for every command.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime
from types import FrameType
from typing import Any

from sluice.cli.output import redacted, terminal_safe
from sluice.core import observe
from sluice.core.services import Services
from sluice.jobs.registry import JOBS, get_job
from sluice.jobs.runner import RunOutcome, run_job
from sluice.jobs.schedule import Schedule, job_schedules, parse
from sluice.store.db import utcnow

# Jobs fired once when the scheduler starts, before any schedule comes due: the
# delivery queue sends what a previous process left behind.
STARTUP_JOBS: tuple[str, ...] = ("delivery-drain",)


def clock(moment: datetime | float) -> str:
    """A time as a person reads it, in the machine's own zone: the time of day, with the
    date when it is not today."""
    stamp = time.localtime(moment.timestamp() if isinstance(moment, datetime) else moment)
    today = time.localtime()[:3] == stamp[:3]
    return time.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M:%S", stamp)


def job_line(name: str, outcome: RunOutcome, seconds: float, trigger: str = "") -> str:
    """One run as one line: when it ended, the job, its outcome and time, and the counts of
    its result that are not zero (the whole result is in the console and, with -v, the log)."""
    body = outcome.body
    if outcome.outcome == "error":
        error = body.get("error", {}) if isinstance(body.get("error"), dict) else {}
        said = str(error.get("message") or "see the error above; -v for its traceback")
    elif outcome.outcome == "skipped":
        said = "already running"
    else:
        said = ", ".join(f"{key} {value}" for key, value in body.items()
                         if isinstance(value, int | float) and not isinstance(value, bool)
                         and value)
    return terminal_safe(f"{clock(time.time())} {name}{f' {trigger}' if trigger else ''}: "
                         f"{outcome.outcome} in {seconds * 1000:.0f} ms"
                         f"{f' ({said})' if said else ''}")


def _print(line: str) -> None:
    print(line, flush=True)


class Scheduler:
    """Fires each job when its next time comes; runs are single-flight through the job lease.
    Each run it fires is ``report``ed as one line (``job_line``)."""

    def __init__(self, services: Services, schedules: dict[str, list[Schedule]],
                 report: Callable[[str], None] = _print) -> None:
        self.services = services
        self.schedules = schedules
        self.report = report
        self.stop = threading.Event()
        now = utcnow()
        self.next_due: dict[tuple[str, int], datetime] = {
            (job, i): s.next_after(now) for job, items in schedules.items()
            for i, s in enumerate(items)
        }

    def tick(self, now: datetime) -> list[str]:
        fired = []
        for (job, i), due in list(self.next_due.items()):
            if now >= due:
                self.next_due[(job, i)] = self.schedules[job][i].next_after(now)
                fired.append(job)
                threading.Thread(target=self._fire, args=(job,), daemon=True,
                                 name=f"job-{job}").start()
        return fired

    def _fire(self, name: str, trigger: str = "") -> None:
        started = time.monotonic()
        outcome = run_job(get_job(name), self.services, "schedule")
        self.report(job_line(name, outcome, time.monotonic() - started, trigger))

    def plan(self) -> list[str]:
        """Each job's next run, soonest first, for the banner."""
        lines = [f"  {job:<16} next at {clock(due)}  {self.schedules[job][i].expression}"
                 + ("  (and now, on start-up)" if job in STARTUP_JOBS else "")
                 for (job, i), due in sorted(self.next_due.items(), key=lambda item: item[1])]
        return ["jobs (a line per run below):", *lines]

    def run(self) -> None:
        for job in (name for name in STARTUP_JOBS if name in self.schedules):
            threading.Thread(target=self._fire, args=(job, "on start-up"), daemon=True,
                             name=f"job-{job}-startup").start()
        while not self.stop.wait(1.0):
            self.tick(utcnow())


class OneLine(logging.Formatter):
    """A log record as a person reads it: time, level and message on one line, without
    the structured fields or a traceback (those are ``-v``'s)."""

    def format(self, record: logging.LogRecord) -> str:
        return terminal_safe(f"{clock(record.created)} {record.levelname.lower()}: "
                             f"{record.getMessage()}")


@contextmanager
def person_logs() -> Iterator[None]:
    """Warnings and errors only, each as one ``OneLine``, while the server runs."""
    handler = getattr(observe.logger, "logger_handler", None)
    if not isinstance(handler, logging.Handler):
        yield
        return
    formatter, level = handler.formatter, observe.logger.log_level
    handler.setFormatter(OneLine())
    observe.logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        handler.setFormatter(formatter)
        observe.logger.setLevel(level)


def app_summary() -> list[str]:
    """The packs on, the app's extensions and what each declares."""
    from sluice.core.extensions import declared, extensions, packs_on
    from sluice.core.packs import ALL

    off = [name for name in ALL if name not in packs_on()]
    lines = [f"  packs        {', '.join(packs_on()) or 'none'}"
             + (f" (off: {', '.join(off)})" if off else "")]
    for extension in extensions():
        names = {kind: [getattr(item, "name", "?") for _, item in declared(kind, [extension])]
                 for kind in ("JOBS", "TOPICS", "CHANNELS")}
        lines.append(f"  app          {extension.source}: jobs {', '.join(names['JOBS']) or '-'}; "
                     f"topics {', '.join(names['TOPICS']) or '-'}; "
                     f"channels {', '.join(names['CHANNELS']) or '-'}")
    return lines


def startup_summary(services: Services, base_url: str) -> str:
    """What is configured, and (with a local HS256 secret, never on Lambda) a one-time login link."""
    from sluice.core.extensions import packs_on
    from sluice.ops.access import ROLES, create_login_nonce, login_links_allowed

    s = services.settings
    redis = ("REST " + redacted(s.upstash_redis_rest_url) if s.upstash_redis_rest_url
             else redacted(s.redis_url) if s.redis_url else "not configured (ledger lists off)")
    admin = ", ".join(name for name, on in (("HS256 secret", s.admin_jwt_secret),
                                              ("JWKS " + (s.admin_jwks_url or ""),
                                               s.admin_jwks_url)) if on) or "not configured"
    channels = [name for name, on in (
        ("webhook", s.webhook_signing_secrets), ("slack", s.slack_bot_token),
        ("telegram", s.telegram_bot_token), ("email", s.smtp_host)) if on]
    lines = [
        "configured:",
        f"  database     {s.database_backend}: {redacted(s.database_url)}",
        f"  redis        {redis}",
        f"  queues       {s.queue_mode} mode"
        + (f", prefix {s.queue_prefix}" if s.queue_mode == "sqs" else "")
        + ("" if s.queue_signing_secrets else ", no signing secret (publishing refused)"),
        f"  cron secret  {'set' if s.cron_secret else 'not set (every cron request is refused)'}",
        f"  admin auth   {admin}",
        *([f"  channels     {', '.join(channels) or 'none configured'}"]
          if "delivery" in packs_on() else []),
        *app_summary(),
    ]
    if login_links_allowed(s):
        nonce = create_login_nonce(s, services.state, sorted(ROLES))
        lines.append(f"console: {base_url}/admin/login?nonce={nonce}  "
                     "(one-time login link, all roles; valid 15 min)")
    else:
        lines.append(f"console: {base_url}/admin/queues  (no login link: set "
                     "SLUICE_ADMIN_JWT_SECRET for one, or use sluice token)")
    return "\n".join(lines)


def serve(services: Services, *, host: str, port: int, scheduler: bool = True,
          verbose: int = 0) -> None:
    """Serve until interrupted; ``verbose`` as ``-v`` counts (0: lines for a person only)."""
    import uvicorn

    from sluice.http.app import create_app

    app = create_app(services, push=True)  # with a push route per topic (sluice.http.push)
    summary = startup_summary(services, f"http://{host}:{port}")
    worker: Scheduler | None = None
    if scheduler:
        schedules = {job: [parse(e) for e in exprs] for job, exprs in job_schedules(JOBS).items()}
        worker = Scheduler(services, schedules)
    print(f"sluice dev: http://{host}:{port}  (database: {services.db.dialect}; "
          f"docs at /api/docs; push signed messages to /api/queues/<topic>)", flush=True)
    print(summary, flush=True)
    print("\n".join(worker.plan() if worker else ["jobs: not fired (--no-scheduler)"]),
          flush=True)
    if worker:  # after the banner, so the start-up run's line comes below it
        threading.Thread(target=worker.run, daemon=True, name="scheduler").start()
    from sluice.core.shutdown import SHUTDOWN

    class Server(uvicorn.Server):
        # Ctrl-C cuts retry waits short at once, before uvicorn waits for requests to end.
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            SHUTDOWN.set()
            super().handle_exit(sig, frame)

    # proxy_headers off: uvicorn would otherwise take X-Forwarded-For from any local caller as
    # the client; client_ip trusts it only from SLUICE_TRUSTED_PROXIES. Its start-up and
    # request lines are logs (-v); its warnings and errors (a port in use) always show.
    config: dict[str, Any] = {"log_level": ("warning", "info", "debug")[min(verbose, 2)],
                              "access_log": verbose > 0}
    with person_logs() if verbose == 0 else nullcontext():
        Server(uvicorn.Config(app, host=host, port=port, proxy_headers=False, **config)).run()
