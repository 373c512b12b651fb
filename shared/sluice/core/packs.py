"""Packs: Sluice's own capabilities, each one a deployment turns on or leaves out.

A pack declares its work the way an app does (``sluice.extend``): a module,
``sluice.packs.<name>``, with ``JOBS``, ``TOPICS`` and ``CHANNELS``, loaded and checked as
an app's extension module is (``sluice.core.extensions``). Beyond that work, a pack owns
the HTTP paths (API routes and console pages, by path prefix) and the ``sluice`` commands
that exist only while it is on.

Which packs are on is declared in one place: ``PACKS``, a list of pack names, in the app's
extension module. When no extension module declares ``PACKS`` (Sluice's own deployment,
or an app that has not chosen), every pack is on. A name that is not a pack, a pack
without the packs it needs (``requires``), or ``PACKS`` declared by two modules is a
``ConfigurationError`` naming the module: a Lambda fails at cold start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from sluice.core.errors import ConfigurationError


class Pack(NamedTuple):
    name: str
    summary: str  # what it brings, in a line (``sluice packs``, docs/extending.md)
    requires: tuple[str, ...] = ()
    # HTTP paths served only with the pack on: a route whose path is one of these, or
    # below one, is left out of the app otherwise (a job's own routes come from JOBS).
    paths: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()  # top-level ``sluice`` commands it owns

    @property
    def module(self) -> str:
        """Its declarations: ``JOBS``, ``TOPICS`` and ``CHANNELS``, as an app's."""
        return f"sluice.packs.{self.name}"


# In this order the tables list their work (after Sluice's core: state-cleanup).
PACKS: tuple[Pack, ...] = (
    Pack("erasure", "erasure requests, purged by erasure-purge when their grace ends",
         paths=("/api/admin/erasure", "/admin/erasure", "/api/admin/console/erasure"),
         commands=("erasure",)),
    Pack("metering", "the metering outbox, flushed to Polar by metering-flush",
         requires=("ledger",), commands=("billing",)),
    Pack("ledger", "the AI usage ledger (sluice.record_usage) and its Redis retry lists, "
                   "redriven by ledger-redrive"),
    Pack("delivery", "the delivery queue (sluice.enqueue_delivery), its channels and "
                     "delivery-drain",
         paths=("/api/admin/delivery", "/api/queue/status", "/admin/deliveries",
                "/api/admin/console/deliveries"),
         commands=("delivery",)),
    Pack("history", "queue depths and job runs sampled by history-sample, drawn as charts",
         paths=("/admin/history", "/api/admin/console/history")),
    Pack("rss", "RSS ingestion: sources, scopes, the rss-refresh tick, the rss.* topics and "
                "the rssQueuePipeline flag",
         paths=("/api/admin/rss", "/api/admin/flags", "/admin/flags"),
         commands=("rss", "flags")),
    Pack("alerts", "alert rules over the RSS catalog; matches become deliveries",
         requires=("rss", "delivery"), paths=("/api/admin/alerts",), commands=("alerts",)),
)
BY_NAME: Mapping[str, Pack] = {pack.name: pack for pack in PACKS}
CHANNELS_PACK = "delivery"  # the pack whose queue sends through the channels
ALL: tuple[str, ...] = tuple(BY_NAME)


class PackOff(ConfigurationError):
    """This deployment leaves the pack out (``PACKS``), so what it does is not here."""

    code = "pack_off"


def choose(declarations: Iterable[tuple[str, object]]) -> tuple[str, ...]:
    """The packs on, in table order, from each ``(source, PACKS)`` an extension declares:
    every pack when none does."""
    found = list(declarations)
    if not found:
        return ALL
    if len(found) > 1:
        raise ConfigurationError(f"{' and '.join(source for source, _ in found)} each declare "
                                 "PACKS; a deployment's packs are declared in one module")
    source, names = found[0]
    if isinstance(names, (str, bytes, Mapping)) or not isinstance(names, Iterable):
        raise ConfigurationError(f"{source}: PACKS must be a list or tuple of pack names")
    chosen = list(names)
    for name in chosen:
        if name not in BY_NAME:
            raise ConfigurationError(f"{source}: PACKS names {name!r}, not a pack; the packs "
                                     f"are {', '.join(ALL)}")
    if len(set(chosen)) != len(chosen):
        raise ConfigurationError(f"{source}: PACKS names a pack twice")
    for name in chosen:
        missing = [need for need in BY_NAME[name].requires if need not in chosen]
        if missing:
            raise ConfigurationError(f"{source}: the {name} pack needs {' and '.join(missing)}; "
                                     "add it to PACKS")
    return tuple(name for name in ALL if name in chosen)


def owner(path: str) -> str | None:
    """The pack that owns the HTTP ``path`` (None: Sluice's core, always served)."""
    for pack in PACKS:
        if any(path == prefix or path.startswith(prefix + "/") for prefix in pack.paths):
            return pack.name
    return None
