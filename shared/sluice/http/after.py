"""The HTTP side of ``sluice.core.after``: each request gets a collector, and what was
collected runs as Starlette background tasks after the response has been sent (under
Mangum, before the Lambda handler returns: see ``sluice.core.after``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.background import BackgroundTasks
from starlette.types import ASGIApp, Receive, Scope, Send

from sluice.core.after import collector


class AfterResponseMiddleware:
    """Pure ASGI: the response's messages pass through untouched; the collected work is
    awaited after the last one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        pending: list[Callable[[], None]] = []
        token = collector.set(pending)
        try:
            await self.app(scope, receive, send)
        finally:
            collector.reset(token)
            await _run(pending)


async def _run(pending: list[Callable[[], None]]) -> None:
    if not pending:
        return
    tasks = BackgroundTasks()
    for task in pending:
        tasks.add_task(task)  # sync callables: run in the thread pool
    await tasks()


def install(app: Any) -> None:
    app.add_middleware(AfterResponseMiddleware)
