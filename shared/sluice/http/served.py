"""Which routes the HTTP app serves: those of Sluice's core and of the packs that are on
(``sluice.core.packs``: each pack owns its paths), and none of them taken by a job.

A job's routes are added before Sluice's own, so a job declaring a route Sluice serves
would take it over unseen: the app refuses to start instead, naming both.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter
from starlette.routing import BaseRoute, Route

from sluice.core.errors import ConfigurationError
from sluice.core.extensions import packs_on
from sluice.core.packs import owner
from sluice.jobs.registry import Job


def served(router: APIRouter) -> APIRouter:
    """``router`` without the routes of the packs this deployment leaves out
    (``sluice.core.packs``: each pack owns its paths)."""
    on = packs_on()
    kept = [route for route in router.routes
            if (pack := owner(getattr(route, "path", ""))) is None or pack in on]
    return router if len(kept) == len(router.routes) else APIRouter(routes=kept)


def refuse_taken_routes(jobs: Iterable[Job], routes: Iterable[BaseRoute]) -> None:
    """A job whose route Sluice already serves (same method, and a path that route
    matches) would take it over unseen: a ``ConfigurationError`` naming both."""
    served_routes = [r for r in routes if isinstance(r, Route)]
    for job in jobs:
        for method in ("GET", "POST"):
            for route in served_routes:
                if method in (route.methods or ()) and route.path_regex.fullmatch(job.route):
                    raise ConfigurationError(
                        f"job {job.name!r} declares the route {method} {job.route}, which "
                        f"Sluice serves as {route.name!r} ({route.path}); give the job "
                        "another route")
