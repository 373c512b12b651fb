"""The Lambda entry points, in the package so an app's deployment reaches them from the
wheel (``sluice/lambda_handlers/cron.handler``); Sluice's own ``functions/`` delegate here.
Everything that decides anything lives in the capability packages.

Importing any handler first loads the configured secrets (SSM / Secrets Manager) into
the environment, before a handler module builds its Settings: every settings field
marked ``secret`` (delivery channel credentials included). With none configured this
costs nothing.

Each handler module does its imports and set-up inside :func:`cold_start`: the cyclic
garbage collector is paused meanwhile (an import graph allocates hundreds of thousands of
long-lived objects, and each full collection during it walks all of them again: about a
quarter of the HTTP function's import time), and what init built is then frozen out of
later collections (``gc.freeze``), since it lives as long as the execution environment.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cold_start() -> Iterator[None]:
    """Run a module's initialisation with the cyclic GC paused; freeze what it built."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()  # only after a complete init: a failed one leaves nothing worth keeping
    finally:
        if was_enabled:
            gc.enable()


with cold_start():
    import os

    from sluice.core import trace
    from sluice.core.secrets import load_secrets
    from sluice.core.shutdown import install, register_extension

    load_secrets()
    # OpenTelemetry set up during init when an OTLP endpoint is configured; otherwise
    # nothing of it is imported (docs/observability.md)
    trace.configure()
    install()  # SIGTERM before Lambda stops the environment cuts retry waits short
    # ...and Lambda sends that SIGTERM only to a function with an extension registered.
    register_extension(os.environ.get("AWS_LAMBDA_RUNTIME_API"))
