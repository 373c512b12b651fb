"""``sluice dev``: the app on 127.0.0.1 and a scheduler firing every job (those of Sluice's
core and of the packs that are on, and the app's: ``sluice.core.extensions``) on its table
entry's schedule."""

from __future__ import annotations

import threading
from datetime import datetime
from types import FrameType
from urllib.parse import urlsplit, urlunsplit

from sluice.core.observe import logger
from sluice.core.services import Services
from sluice.jobs.registry import JOBS, get_job
from sluice.jobs.runner import run_job
from sluice.jobs.schedule import Schedule, job_schedules, parse
from sluice.store.db import utcnow

# Jobs fired once when the scheduler starts, before any schedule comes due: the
# delivery queue sends what a previous process left behind.
STARTUP_JOBS: tuple[str, ...] = ("delivery-drain",)


class Scheduler:
    """Fires each job when its next time comes; runs are single-flight through the job lease."""

    def __init__(self, services: Services, schedules: dict[str, list[Schedule]]) -> None:
        self.services = services
        self.schedules = schedules
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

    def _fire(self, name: str) -> None:
        outcome = run_job(get_job(name), self.services, "schedule")
        logger.info(f"[dev] {name} -> {outcome.outcome}", extra={"result": outcome.body})

    def run(self) -> None:
        for job in (name for name in STARTUP_JOBS if name in self.schedules):
            logger.info(f"[dev] {job} on start-up")
            threading.Thread(target=self._fire, args=(job,), daemon=True,
                             name=f"job-{job}-startup").start()
        for (job, _), due in sorted(self.next_due.items(), key=lambda item: item[1]):
            logger.info(f"[dev] {job} next at {due.isoformat()}")
        while not self.stop.wait(1.0):
            self.tick(utcnow())


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if not parts.password:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@",
                                                                  ":***@")))


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
    redis = ("REST " + _redacted(s.upstash_redis_rest_url) if s.upstash_redis_rest_url
             else _redacted(s.redis_url) if s.redis_url else "not configured (ledger lists off)")
    admin = ", ".join(name for name, on in (("HS256 secret", s.admin_jwt_secret),
                                              ("JWKS " + (s.admin_jwks_url or ""),
                                               s.admin_jwks_url)) if on) or "not configured"
    channels = [name for name, on in (
        ("webhook", s.webhook_signing_secrets), ("slack", s.slack_bot_token),
        ("telegram", s.telegram_bot_token), ("email", s.smtp_host)) if on]
    lines = [
        "configured:",
        f"  database     {s.database_backend}: {_redacted(s.database_url)}",
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


def serve(services: Services, *, host: str, port: int, scheduler: bool = True) -> None:
    import uvicorn

    from sluice.http.app import create_app

    # Built before the scheduler starts, so the server is up as early as before it.
    app = create_app(services, push=True)  # with a push route per topic (sluice.http.push)
    summary = startup_summary(services, f"http://{host}:{port}")
    if scheduler:
        schedules = {job: [parse(e) for e in exprs] for job, exprs in job_schedules(JOBS).items()}
        worker = Scheduler(services, schedules)
        threading.Thread(target=worker.run, daemon=True, name="scheduler").start()
    print(f"sluice dev: http://{host}:{port}  (database: {services.db.dialect}; "
          f"docs at /api/docs; push signed messages to /api/queues/<topic>)", flush=True)
    print(summary, flush=True)
    from sluice.core.shutdown import SHUTDOWN

    class Server(uvicorn.Server):
        # Ctrl-C cuts retry waits short at once, before uvicorn waits for requests to end.
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            SHUTDOWN.set()
            super().handle_exit(sig, frame)

    # proxy_headers off: uvicorn would otherwise take X-Forwarded-For from any local caller as
    # the client; client_ip trusts it only from SLUICE_TRUSTED_PROXIES.
    Server(uvicorn.Config(app, host=host, port=port, log_level="info",
                          proxy_headers=False)).run()
