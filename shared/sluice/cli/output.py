"""How every ``sluice`` command speaks, so a script can rely on it.

- ``--json`` (added to every command that prints data): one JSON document on stdout and
  nothing else; without it, text for a person.
- stderr stays empty at the default verbosity unless something went wrong: logs and metric
  blobs only with ``-v``, the database in use only in human mode.
- A command other than ``migrate`` and ``dev`` never creates an SQLite database: a missing
  file is a configuration error naming the path, not a silent new empty store.

``main`` sets the ``Mode`` from the parsed arguments for the command's run; the command modules
read it through ``emit`` and ``mode()``, so a new command inherits all of it.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sluice.core.times import json_default
from sluice.store.db import require_existing, sqlite_path


@dataclass
class Mode:
    json: bool = False
    verbose: int = 0
    command: str = ""


_MODE = Mode()


def mode() -> Mode:
    return _MODE


@contextmanager
def speaking(new: Mode) -> Iterator[None]:
    """Run a command in ``new`` mode: the log level and metric output follow ``-v``, and
    are put back afterwards (a command run in process leaves its host as it found it)."""
    global _MODE
    from sluice.core import observe

    before = (_MODE, observe.logger.log_level, observe.metrics_quiet())
    _MODE = new
    observe.logger.setLevel(logging.DEBUG if new.verbose > 1 else
                            logging.INFO if new.verbose == 1 else logging.ERROR)
    observe.quiet_metrics(new.verbose == 0)
    try:
        yield
    finally:
        _MODE = before[0]
        observe.logger.setLevel(before[1])
        observe.quiet_metrics(before[2])


def note(message: str) -> None:
    """Progress a person may want (``-v``): never on stderr by default."""
    if _MODE.verbose:
        print(message, file=sys.stderr)


def emit(body: Any, human: Callable[[Any], Iterable[str]] | None = None) -> None:
    """``body`` as one JSON document with ``--json``; else ``human(body)`` lines (or a
    generic ``key: value`` rendering)."""
    if _MODE.json:
        print(json.dumps(body, ensure_ascii=False, default=json_default))
        return
    for line in (human or human_lines)(body):
        print(line)


def human_lines(value: Any, indent: str = "") -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and item and not _flat(item):
                yield f"{indent}{key}:"
                yield from human_lines(item, indent + "  ")
            else:
                yield f"{indent}{key}: {_scalar(item)}"
    elif isinstance(value, list):
        if not value:
            yield f"{indent}(none)"
        for item in value:
            if isinstance(item, dict):
                lines = list(human_lines(item, indent + "  "))
                yield f"{indent}- {lines[0].lstrip()}" if lines else f"{indent}- {{}}"
                yield from lines[1:]
            else:
                yield f"{indent}- {_scalar(item)}"
    else:
        yield f"{indent}{_scalar(value)}"


def _flat(item: dict[str, Any] | list[Any]) -> bool:
    values = item.values() if isinstance(item, dict) else item
    return len(item) <= 4 and not any(isinstance(v, dict | list) for v in values)


def _scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=json_default)


def age(seconds: float | None) -> str:
    """An age a person reads at a glance: 42s, 7m, 3h 20m, 2d 4h."""
    if seconds is None:
        return "?"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def redacted(url: str) -> str:
    parts = urlsplit(url)
    if not parts.password:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))


def check_database(url: str, *, may_create: bool) -> str:
    """Refuse to open an SQLite file that does not exist unless the command creates stores;
    answers how to name the database to a person."""
    path = sqlite_path(url)
    if path is None:
        return redacted(url)
    if not may_create:
        require_existing(url)
    return f"sqlite {path}"
