"""``sluice dev``: the app on 127.0.0.1 and a scheduler firing jobs as serverless.yml says."""

from __future__ import annotations

import threading
from datetime import datetime

from shared.core.observe import logger
from shared.core.services import Services
from shared.jobs.registry import get_job
from shared.jobs.runner import run_job
from shared.jobs.schedule import Schedule, job_schedules, parse
from shared.store.db import utcnow

# Jobs fired once when the scheduler starts, before any schedule comes due: the
# delivery queue sends what a previous process left behind (the seed's drainOnStartup).
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
        for job in STARTUP_JOBS:
            logger.info(f"[dev] {job} on start-up")
            threading.Thread(target=self._fire, args=(job,), daemon=True,
                             name=f"job-{job}-startup").start()
        for (job, _), due in sorted(self.next_due.items(), key=lambda item: item[1]):
            logger.info(f"[dev] {job} next at {due.isoformat()}")
        while not self.stop.wait(1.0):
            self.tick(utcnow())


def serve(services: Services, *, host: str, port: int, scheduler: bool = True) -> None:
    import uvicorn

    from shared.http.app import create_app

    if scheduler:
        schedules = {job: [parse(e) for e in exprs] for job, exprs in job_schedules().items()}
        worker = Scheduler(services, schedules)
        threading.Thread(target=worker.run, daemon=True, name="scheduler").start()
    print(f"sluice dev: http://{host}:{port}  (database: {services.db.dialect}; "
          f"docs at /api/docs)", flush=True)
    uvicorn.run(create_app(services), host=host, port=port, log_level="info")
