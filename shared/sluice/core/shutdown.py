"""Shutdown: one process-wide event that cuts every wait short.

``sluice dev`` stops on Ctrl-C, and Lambda sends the runtime SIGTERM before it stops an
execution environment, but only when the function has an extension registered (with none
it kills the runtime outright). :func:`register_extension` registers an internal one at
cold start so that SIGTERM comes. Internal extensions may not register for the
``SHUTDOWN`` event (the Extensions API refuses it: that event is for external ones), so
ours registers for no event at all: its thread blocks in ``event/next``, which Lambda
never answers, and costs nothing per invocation. SIGTERM is what ends the waits.

A retry wait that sleeps through a shutdown delays it and risks being killed mid-send,
so waits go through :func:`sleep_with_abort`, which ends at once when :data:`SHUTDOWN`
is set and raises ``ShutdownRequested``. The caller then hands the failed attempt back
to the queue, whose own schedule retries it on a later run.
"""

from __future__ import annotations

import json
import signal
import threading
from types import FrameType

from sluice.core.errors import ShutdownRequested

SHUTDOWN = threading.Event()


def sleep_with_abort(seconds: float, abort: threading.Event | None = None) -> None:
    """Wait ``seconds``, or raise ``ShutdownRequested`` as soon as ``abort`` is set."""
    if (abort or SHUTDOWN).wait(max(0.0, seconds)):
        raise ShutdownRequested()


def install(signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)) -> bool:
    """Set :data:`SHUTDOWN` on these signals, then call the handler that was there before.

    Signal handlers can only be set from the main thread: elsewhere this does nothing
    and says so (False)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for signum in signals:
        previous = signal.getsignal(signum)

        def handle(number: int, frame: FrameType | None,
                   previous: object = previous) -> None:
            SHUTDOWN.set()
            if callable(previous):
                previous(number, frame)

        signal.signal(signum, handle)
    return True


EXTENSION_NAME = "sluice-shutdown"
EXTENSIONS_API = "/2020-01-01/extension"
# Init is limited to 10 s in all; a runtime API that does not answer registration this
# fast is broken, and the function still runs without the extension.
REGISTER_TIMEOUT_S = 2.0


def register_extension(runtime_api: str | None, name: str = EXTENSION_NAME) -> str | None:
    """Register an internal extension with the Lambda Extensions API at ``runtime_api``
    (``AWS_LAMBDA_RUNTIME_API``, host:port) and keep its ``event/next`` call open on a daemon
    thread; answers the extension's identifier, or None (no runtime API, or it refused:
    logged, and the function runs as before, only without SIGTERM)."""
    if not runtime_api:
        return None
    from sluice.core.observe import logger  # only on Lambda: the package's init stays lean

    try:
        status, headers, _ = _request(runtime_api, "POST", f"{EXTENSIONS_API}/register",
                                      {"Lambda-Extension-Name": name},
                                      json.dumps({"events": []}).encode(), REGISTER_TIMEOUT_S)
    except OSError as exc:
        logger.warning(f"extension {name}: the runtime API did not answer ({exc})")
        return None
    identifier = headers.get("lambda-extension-identifier")
    if status != 200 or not identifier:
        logger.warning(f"extension {name}: registration refused ({status})")
        return None
    threading.Thread(target=_wait_for_events, args=(runtime_api, identifier), daemon=True,
                     name=f"extension-{name}").start()
    return identifier


def _wait_for_events(runtime_api: str, identifier: str) -> None:
    """``event/next`` until Lambda answers with something other than an event: registered for
    none, the call stays open; a ``SHUTDOWN`` (the documented event, were one ever sent)
    sets :data:`SHUTDOWN` like SIGTERM does."""
    from sluice.core.observe import logger

    while True:
        try:
            status, _, body = _request(runtime_api, "GET", f"{EXTENSIONS_API}/event/next",
                                       {"Lambda-Extension-Identifier": identifier}, None, None)
            event = json.loads(body) if status == 200 else None
        except (OSError, ValueError) as exc:
            logger.warning(f"extension: event/next failed ({exc}); the extension stops")
            return
        if not isinstance(event, dict):
            logger.warning(f"extension: event/next answered {status}; the extension stops")
            return
        if event.get("eventType") == "SHUTDOWN":
            SHUTDOWN.set()
            return


def _request(runtime_api: str, method: str, path: str, headers: dict[str, str],
             body: bytes | None, timeout: float | None) -> tuple[int, dict[str, str], bytes]:
    import http.client  # only on Lambda: the package's init stays lean elsewhere

    host, _, port = runtime_api.rpartition(":")
    connection = http.client.HTTPConnection(host or runtime_api, int(port) if host else None,
                                            timeout=timeout)
    try:
        connection.request(method, path, body=body,
                           headers={**headers, "Content-Type": "application/json"})
        response = connection.getresponse()
        return (response.status, {k.lower(): v for k, v in response.getheaders()},
                response.read(65_536))
    finally:
        connection.close()
