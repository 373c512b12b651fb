"""The job registry: name -> drain, route, schedule, admin surface.

A job is one entry in ``JOBS`` plus its drain: Sluice's core job below, each pack's in
its module (``sluice.packs``), an app's in its extension module (``sluice.core.extensions``). ``sluice generate`` (and, for this
repository, ``python -m infra.generate``) writes each job's function, schedule, role and
alarms into the deployment; ``sluice dev`` fires the same schedules from this table. The
drain itself is imported only when the job runs, so a scheduled function loads just its
own drain.
"""

from __future__ import annotations

import importlib
import re
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from sluice.core.errors import ConfigurationError, UnknownJob
from sluice.core.extensions import Table
from sluice.core.surfaces import SURFACE_ROLES, Surface
from sluice.store.db import Tx

if TYPE_CHECKING:
    from sluice.core.services import Services

Trigger = Literal["schedule", "cron_http", "admin", "cli"]
Result = dict[str, Any]


class Deadline:
    """When a drain must stop: the smaller of its budget and Lambda's remaining time less a margin."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.seconds = max(0.0, seconds)
        self.at = clock() + self.seconds

    @classmethod
    def for_run(cls, budget_s: float, lambda_remaining_ms: int | None, margin_s: float,
                clock: Callable[[], float] = time.monotonic) -> Deadline:
        seconds = budget_s
        if lambda_remaining_ms is not None:
            seconds = min(seconds, lambda_remaining_ms / 1000 - margin_s)
        return cls(seconds, clock)

    def remaining(self) -> float:
        return max(0.0, self.at - self._clock())

    def expired(self) -> bool:
        return self._clock() >= self.at


# The parameters of a statement that checks the lease itself (see ``Fence.bind``).
FenceParams = dict[str, Any]
UNFENCED: FenceParams = {"fence_job": None, "fence_holder": None, "fence_now": None}


class Fence(Protocol):
    """Raises ``LeaseLost`` inside ``tx`` when the run no longer holds its lease.

    ``check`` is a statement of its own; ``bind`` and ``confirm`` fold the check into
    the side effect's statement (one round trip for both): ``bind`` gives its
    ``fence_*`` parameters, and ``confirm`` reads the ``lease_held`` column of the rows
    it returned."""

    def check(self, tx: Tx) -> None: ...

    def bind(self, tx: Tx) -> FenceParams: ...

    def confirm(self, rows: list[dict[str, Any]]) -> None: ...


class _Unfenced:
    def check(self, tx: Tx) -> None:
        pass

    def bind(self, tx: Tx) -> FenceParams:
        return UNFENCED

    def confirm(self, rows: list[dict[str, Any]]) -> None:
        pass


NO_FENCE: Fence = _Unfenced()


class JobContext:
    """What a drain gets: its services, its deadline, who triggered it, a progress hook, and
    the fence it checks before each side effect (``sluice.jobs.runs.Fence``)."""

    __slots__ = ("deadline", "fence", "params", "progress", "request_id", "services",
                 "started_at", "trigger")

    def __init__(self, services: Services, deadline: Deadline, trigger: Trigger, request_id: str,
                 started_at: datetime, params: Mapping[str, str] | None = None,
                 progress: Callable[[str], None] | None = None,
                 fence: Fence | None = None) -> None:
        self.fence: Fence = fence or NO_FENCE
        self.services = services
        self.deadline = deadline
        self.trigger = trigger
        self.request_id = request_id
        self.started_at = started_at
        self.params: Mapping[str, str] = params or {}
        self.progress: Callable[[str], None] = progress or _no_progress


def _no_progress(message: str) -> None:
    pass


Drain = Callable[[JobContext], Result]


class Param(NamedTuple):
    """A query parameter a job's routes honour; ``ctx.params`` carries it as given
    (``true`` / ``false``, digits), already checked against this declaration."""

    name: str
    kind: Literal["boolean", "integer"]
    cron: bool = False  # honoured on the cron GET as well as on the admin POST
    minimum: int | None = None
    maximum: int | None = None


class Job(NamedTuple):
    name: str
    route: str
    schedule: str  # AWS EventBridge expression: rate(...) or cron(...)
    surface: Surface
    target: str  # "module:function", imported when the job runs
    failure_keys: tuple[str, ...] = ()
    budget_s: float = 50.0
    timeout_s: int = 60
    # Push-queue topics the job publishes to (its function gets a role that may send there).
    publishes: tuple[str, ...] = ()
    params: tuple[Param, ...] = ()
    # Reads the push queues' figures (its function's role may read their attributes).
    reads_queues: bool = False

    @property
    def function_key(self) -> str:
        """The job's function in serverless.yml: ``state-cleanup`` -> ``stateCleanup``."""
        first, *rest = self.name.split("-")
        return first + "".join(word.capitalize() for word in rest)

    def resolve(self) -> Drain:
        module, _, attr = self.target.partition(":")
        drain: Drain = getattr(importlib.import_module(module), attr)
        return drain

    def failures(self, result: Result) -> int:
        """How many failures a result reports, summed over ``failure_keys`` (lists count items)."""
        total = 0
        for key in self.failure_keys:
            value = result.get(key)
            if isinstance(value, bool):
                continue
            if isinstance(value, int):
                total += value
            elif isinstance(value, list):
                total += len(value)
        return total


# Sluice's core: the jobs every deployment runs. Each pack's jobs are in its module
# (``sluice.packs.<name>``, ``sluice.core.packs``), declared as an app declares its own.
CORE_JOBS: tuple[Job, ...] = (
    Job(
        name="state-cleanup",
        route="/api/admin/state/cleanup",
        schedule="cron(15 3 * * ? *)",
        surface="state",
        target="sluice.jobs.cleanup:run_state_cleanup",
        failure_keys=("failed",),
        budget_s=50.0,
        timeout_s=60,
    ),
)

NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
MAX_NAME = 40  # the function's name (service-stage-camelName) stays under Lambda's 64


def check_job(item: object, source: str) -> Job:
    """A declared job, well formed: a name the deployment can use, a route under
    ``/api/``, a schedule AWS and ``sluice dev`` both read, a known surface, a
    ``module:function`` target and a budget inside its timeout."""
    if not isinstance(item, Job):
        raise ConfigurationError(f"{source}: JOBS holds {item!r}, not a sluice.extend.Job")
    where = f"{source}: job {item.name!r}"
    if not (isinstance(item.name, str) and NAME.fullmatch(item.name)
            and len(item.name) <= MAX_NAME):
        raise ConfigurationError(f"{where}: a name is lower-case words joined by '-' "
                                 f"(at most {MAX_NAME} characters)")
    if not (item.route.startswith("/api/") and re.fullmatch(r"[a-z0-9/_-]+", item.route)):
        raise ConfigurationError(f"{where}: route must be a path under /api/")
    if item.surface not in SURFACE_ROLES:
        raise ConfigurationError(f"{where}: surface must be one of {', '.join(SURFACE_ROLES)}")
    if not TARGET.fullmatch(item.target):
        raise ConfigurationError(f"{where}: target must be 'module:function'")
    if not 0 < item.budget_s < item.timeout_s <= 900:
        raise ConfigurationError(f"{where}: budget_s must be above 0 and below timeout_s "
                                 "(at most 900, Lambda's limit)")
    from sluice.jobs.schedule import parse

    try:
        parse(item.schedule)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc.message}") from None
    return item


def routes_clash(jobs: Mapping[str, Job]) -> None:
    """Two jobs on one route would shadow each other's admin POST and cron GET."""
    seen: dict[str, str] = {}
    for job in jobs.values():
        if job.route in seen:
            raise ConfigurationError(f"jobs {seen[job.route]!r} and {job.name!r} share the "
                                     f"route {job.route}")
        seen[job.route] = job.name


JOBS: Table[Job] = Table("JOBS", CORE_JOBS, lambda job: job.name, check_job, routes_clash)


def get_job(name: str) -> Job:
    try:
        return JOBS[name]
    except KeyError:
        raise UnknownJob(f"no job named {name!r}; known: {', '.join(sorted(JOBS))}") from None
