"""How every ``sluice`` command speaks, so a script can rely on it.

- ``--json`` (added to every command that prints data): one JSON document on stdout and
  nothing else; without it, text for a person.
- stderr stays empty at the default verbosity unless something went wrong: logs (errors
  logged on the way included: a failing handler's traceback) and metric blobs only with
  ``-v``, the database in use only in human mode. An error is one line on stderr and, with
  ``--json``, a JSON document on stdout too, with the same exit code (``failed``).
- A command other than ``migrate`` and ``dev`` never creates an SQLite database: a missing
  file is a configuration error naming the path, not a silent new empty store.
- Nothing a peer stored can drive the terminal: every character a terminal acts on (C0 and
  C1 controls, ESC sequences, bidirectional overrides and isolates, line and paragraph
  separators) is printed escaped (``\x1b``, ``\u202e``). ``emit`` escapes each value of the
  body before a command's own formatter sees it (a line break inside a field cannot start a
  line of its own), and ``speaking`` puts a guard on stdout and stderr that escapes whatever
  else a command prints (in ``--json`` mode as JSON's ``\u001b``, so the document means the
  same). Only the progress line of ``terminal()`` writes a control sequence of its own.

``main`` sets the ``Mode`` from the parsed arguments for the command's run; the command modules
read it through ``emit`` and ``mode()``, so a new command inherits all of it.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

from sluice.core.errors import SluiceError
from sluice.core.times import json_default, jsonable
from sluice.store.db import require_existing, sqlite_path


@dataclass
class Mode:
    json: bool = False
    verbose: int = 0
    command: str = ""


_MODE = Mode()
# The log level at the default verbosity: Sluice logs nothing at CRITICAL, so no log line
# at all (a command's own error is its one line on stderr; the logs, errors too, need -v).
QUIET = logging.CRITICAL


def mode() -> Mode:
    return _MODE


# What a terminal acts on: controls (C0, DEL, C1: ESC, CSI, OSC, BEL, CR...), format
# characters (bidirectional embeddings, overrides and isolates, zero-width joiners),
# line and paragraph separators, and lone surrogates (which cannot even be encoded).
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def unsafe(char: str) -> bool:
    return unicodedata.category(char) in UNSAFE_CATEGORIES


def _escape(char: str, as_json: bool) -> str:
    code = ord(char)
    if as_json and code > 0xFFFF:  # JSON spells it as a surrogate pair
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    if as_json or code > 0xFF:
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return f"\\x{code:02x}"


def terminal_safe(text: str, *, keep: str = "", as_json: bool = False) -> str:
    """``text`` with every character a terminal acts on escaped, except those in ``keep``."""
    if text.isprintable():
        return text
    return "".join(_escape(c, as_json) if c not in keep and unsafe(c) else c for c in text)


def safe_value(value: Any) -> Any:
    """A body with every string in it (keys too) made ``terminal_safe``, line breaks included."""
    if isinstance(value, str):
        return terminal_safe(value)
    if isinstance(value, dict):
        return {safe_value(k): safe_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [safe_value(v) for v in value]
    return value


class Guarded(io.TextIOBase):
    """A text stream that escapes what it is given before ``target`` sees it; line breaks
    pass (a command's own lines), anything else unsafe is escaped."""

    def __init__(self, target: TextIO, *, as_json: bool) -> None:
        self.target = target
        self.as_json = as_json

    def write(self, text: str) -> int:
        self.target.write(terminal_safe(text, keep="\n", as_json=self.as_json))
        return len(text)

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        return self.target.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.target, "encoding", "utf-8")


def terminal() -> TextIO:
    """The real stderr under the guard, for the progress line's own control sequence."""
    stream = sys.stderr
    return stream.target if isinstance(stream, Guarded) else stream


@contextmanager
def speaking(new: Mode) -> Iterator[None]:
    """Run a command in ``new`` mode: the log level and metric output follow ``-v``, stdout
    and stderr are guarded, and all of it is put back afterwards (a command run in process
    leaves its host as it found it)."""
    global _MODE
    from sluice.core import observe

    before = (_MODE, observe.logger.log_level, observe.metrics_quiet(), sys.stdout, sys.stderr)
    _MODE = new
    observe.logger.setLevel(logging.DEBUG if new.verbose > 1 else
                            logging.INFO if new.verbose == 1 else QUIET)
    observe.quiet_metrics(new.verbose == 0)
    # Libraries' own log records (psycopg's pool retrying a connection) reach stderr through
    # logging's last-resort handler when no handler takes them: at the default verbosity, one
    # that drops them does.
    dropped = logging.NullHandler() if new.verbose == 0 else None
    if dropped is not None:
        logging.getLogger().addHandler(dropped)
    sys.stdout = Guarded(before[3], as_json=new.json)
    sys.stderr = Guarded(before[4], as_json=False)
    # The log handler holds the stream it was built with; its lines are JSON (written
    # with ensure_ascii off), so their unsafe characters become JSON escapes.
    handler = getattr(observe.logger, "logger_handler", None)
    logs = handler if isinstance(handler, logging.StreamHandler) else None
    logged_to = logs.setStream(Guarded(logs.stream, as_json=True)) if logs else None
    try:
        yield
    finally:
        if logs is not None and logged_to is not None:
            logs.setStream(logged_to)
        if dropped is not None:
            logging.getLogger().removeHandler(dropped)
        sys.stdout, sys.stderr = before[3], before[4]
        _MODE = before[0]
        observe.logger.setLevel(before[1])
        observe.quiet_metrics(before[2])


def note(message: str) -> None:
    """Progress a person may want (``-v``): never on stderr by default."""
    if _MODE.verbose:
        print(message, file=sys.stderr)


class InternalError(SluiceError):
    """The command failed on a defect (its traceback is on stderr)."""

    code = "internal_error"


def failed(exc: SluiceError, line: str) -> None:
    """An error, reported alike by every command: ``line`` on stderr for a person and, with
    ``--json``, the error as one JSON document on stdout too (the HTTP API's error body:
    ``{"error": {"code", "message", "field"…}}``); the exit code is the caller's, the same
    in both modes."""
    if _MODE.json:
        emit_json(exc.to_body())
    print(line, file=sys.stderr)


def emit(body: Any, human: Callable[[Any], Iterable[str]] | None = None) -> None:
    """``body`` as one JSON document with ``--json``; else ``human(body)`` lines (or a
    generic ``key: value`` rendering), made from the body with every string escaped."""
    if _MODE.json:
        emit_json(body)
        return
    for line in (human or human_lines)(safe_value(jsonable(body))):
        print(line)


def emit_json(body: Any, *, compact: bool = False) -> None:
    """``body`` as one JSON document on one line, whatever the mode (``sluice sign``)."""
    text = json.dumps(body, ensure_ascii=False, default=json_default,
                      separators=(",", ":") if compact else None)
    print(terminal_safe(text, as_json=True))


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
