"""Sluice's thread pools (feed fetches, the alert sweep's batches) run inline here.

The work each task does is unchanged; only the threads are gone: the order of effects is
then fixed by the code alone (one seed, one history), and a tick does not pay for
starting threads, which dominates its cost on a busy two-core machine.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, Self

POOLED = ("sluice.rss.catalog", "sluice.alerts.sweep")


class InlineExecutor:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any]) -> Iterator[Any]:
        return iter([fn(*args) for args in zip(*iterables, strict=False)])

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - a pool hands the error to the future
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True, **kwargs: Any) -> None:
        pass


@contextmanager
def inline_pools() -> Iterator[None]:
    import importlib

    saved = {}
    for name in POOLED:
        module = importlib.import_module(name)
        saved[name] = module.ThreadPoolExecutor
        module.ThreadPoolExecutor = InlineExecutor  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for name, original in saved.items():
            sys.modules[name].ThreadPoolExecutor = original  # type: ignore[attr-defined]
