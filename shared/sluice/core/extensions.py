"""The app's own work: extension modules an app names, and the tables built from them.

An app declares its cron jobs, push-queue topics and delivery channels in a module of its
own package, as module attributes ``JOBS``, ``TOPICS`` and ``CHANNELS`` (sequences of
``sluice.extend.Job`` / ``Topic`` / ``Channel``). Sluice finds such modules two ways, both
read here and nowhere else:

- an entry point in the group ``sluice.extensions`` of an installed distribution (the
  app's pyproject: ``[project.entry-points."sluice.extensions"] myapp = "myapp.sluice_ext"``);
- ``SLUICE_APP``: comma-separated module names (``SLUICE_APP=myapp.sluice_ext``).

Sluice's own capabilities are packs (``sluice.core.packs``), each a module declared and
loaded the same way, as an extension of its own; the app's ``PACKS`` says which are on.
Each table (``sluice.jobs.registry.JOBS``, ``sluice.queues.topics.TOPICS``,
``sluice.delivery.channels.channels()``) is Sluice's core entries, then the packs that are
on, then the app's declarations, merged on first use. A module that fails to import, an
attribute that is not a sequence of the right type, or a name Sluice (or another
extension) already uses is a ``ConfigurationError`` naming the module: a Lambda fails at
cold start, not on a message.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import Generic, NamedTuple, TypeVar

from sluice.core.errors import ConfigurationError
from sluice.core.packs import BY_NAME, CHANNELS_PACK, PackOff, choose
from sluice.core.settings import read_field

GROUP = "sluice.extensions"
KINDS = ("JOBS", "TOPICS", "CHANNELS")
T = TypeVar("T")


class Extension(NamedTuple):
    source: str  # how it was found: "entry point NAME (module)" or "SLUICE_APP (module)"
    module: ModuleType
    # the app's top-level packages, which its deployment ships: its distribution's, for an
    # entry point; the module's own top-level package, for SLUICE_APP
    packages: tuple[str, ...]


def _load(name: str, source: str, packages: tuple[str, ...] = ()) -> Extension:
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # any failure of the app's import is its configuration
        raise ConfigurationError(f"{source}: cannot import {name!r}: {exc}") from exc
    return Extension(f"{source} ({name})", module, packages or (name.partition(".")[0],))


def _top_level(point: EntryPoint) -> tuple[str, ...]:
    text = point.dist.read_text("top_level.txt") if point.dist is not None else None
    return tuple(line.strip() for line in (text or "").splitlines() if line.strip())


def load(modules: Iterable[str] = (), *, group: str | None = GROUP) -> tuple[Extension, ...]:
    """The extension modules: the entry points of ``group`` (None: none), then ``modules``;
    one module named both ways counts once."""
    found: dict[str, Extension] = {}
    if group is not None:
        for point in sorted(entry_points(group=group), key=lambda p: p.name):
            found.setdefault(point.value, _load(point.value, f"entry point {point.name!r}",
                                                _top_level(point)))
    for name in modules:
        if name not in found:
            found[name] = _load(name, "SLUICE_APP")
    return tuple(found.values())


@cache
def extensions() -> tuple[Extension, ...]:
    """The extensions this process runs with: entry points and ``SLUICE_APP``, once."""
    modules: tuple[str, ...] = read_field("app_modules")
    return load(modules)


def packs_of(apps: Iterable[Extension]) -> tuple[str, ...]:
    """The packs ``apps`` turn on (their ``PACKS``; every pack when none declares it)."""
    return choose((app.source, app.module.PACKS) for app in apps
                  if hasattr(app.module, "PACKS"))


def with_packs(apps: Iterable[Extension]) -> tuple[Extension, ...]:
    """The packs ``apps`` turn on, each loaded as an extension, then ``apps``."""
    apps = tuple(apps)
    names = packs_of(apps)
    for app in apps:
        if CHANNELS_PACK not in names and getattr(app.module, "CHANNELS", None):
            raise ConfigurationError(f"{app.source}: CHANNELS needs the {CHANNELS_PACK} pack, "
                                     "which PACKS leaves out")
    packs = tuple(_load(BY_NAME[name].module, f"pack {name!r}", ("sluice",)) for name in names)
    return (*packs, *apps)


@cache
def active() -> tuple[Extension, ...]:
    """What this process's tables are made of: the packs on, then the app's extensions."""
    return with_packs(extensions())


@cache
def packs_on() -> tuple[str, ...]:
    """The packs on in this process (without loading them)."""
    return packs_of(extensions())


def require_pack(name: str, what: str) -> None:
    """``PackOff`` unless pack ``name`` is on: ``what`` needs it."""
    if name not in packs_on():
        declared_in = next((e.source for e in extensions() if hasattr(e.module, "PACKS")), "")
        raise PackOff(f"{what} needs the {name} pack, which this deployment leaves out "
                      f"(PACKS in {declared_in})")


def declared(kind: str, extensions: Iterable[Extension]) -> Iterator[tuple[str, object]]:
    """Each item an extension declares under ``kind``, with where it came from."""
    if kind not in KINDS:
        raise ValueError(kind)
    for extension in extensions:
        items = getattr(extension.module, kind, ())
        if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
            raise ConfigurationError(f"{extension.source}: {kind} must be a list or tuple")
        for item in items:
            yield extension.source, item


class Table(MutableMapping[str, T], Generic[T]):
    """Sluice's core entries plus the extensions' (``kind``: the packs on and the app's),
    merged on first use.

    ``check(item, source)`` returns the item when it is well formed (else raises
    ``ConfigurationError``); ``name(item)`` is its key. A repeated name is refused, and
    ``whole(table)`` checks what spans entries (two jobs on one route)."""

    def __init__(self, kind: str, own: Iterable[T], name: Callable[[T], str],
                 check: Callable[[object, str], T],
                 whole: Callable[[Mapping[str, T]], None] | None = None,
                 extensions: Callable[[], Iterable[Extension]] = active) -> None:
        self.kind = kind
        self.own: dict[str, T] = {name(item): item for item in own}
        self._name = name
        self._check = check
        self._whole = whole
        self._extensions = extensions
        self._merged: dict[str, T] | None = None

    def merged(self) -> dict[str, T]:
        if self._merged is None:
            merged = dict(self.own)
            sources = []
            for source, raw in declared(self.kind, self._extensions()):
                sources.append(source)
                item = self._check(raw, source)
                key = self._name(item)
                if key in merged:
                    raise ConfigurationError(f"{source}: {self.kind} declares {key!r}, "
                                             "a name already taken")
                merged[key] = item
            if self._whole is not None:
                try:
                    self._whole(merged)
                except ConfigurationError as exc:
                    raise ConfigurationError(f"{', '.join(dict.fromkeys(sources))}: "
                                             f"{exc.message}") from None
            self._merged = merged
        return self._merged

    def using(self, apps: Iterable[Extension]) -> Table[T]:
        """This table as other app extensions would make it, with the packs they turn on (a
        test's, or ``sluice generate``'s; ``()``: Sluice's own deployment, every pack)."""
        chosen = with_packs(apps)
        return Table(self.kind, self.own.values(), self._name, self._check, self._whole,
                     lambda: chosen)

    def __getitem__(self, key: str) -> T:
        return self.merged()[key]

    def __setitem__(self, key: str, value: T) -> None:
        """An entry replaced in this process (a test's stand-in for a job)."""
        self.merged()[key] = value

    def __delitem__(self, key: str) -> None:
        del self.merged()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.merged())

    def __len__(self) -> int:
        return len(self.merged())

    def __repr__(self) -> str:
        return f"Table({self.kind}, {list(self.merged())})"
