"""``sluice packs``: which of Sluice's packs this deployment runs, and what each brings.

The command line itself follows the same table: the commands of a pack that is off are not
there (``leave_out``), so ``sluice rss`` in a deployment without the rss pack is an unknown
command (exit 64), as its routes are absent from the HTTP app and its jobs from ``JOBS``.
"""

from __future__ import annotations

import argparse
from typing import Any

from sluice.cli.output import emit
from sluice.core.extensions import extensions, packs_on
from sluice.core.packs import PACKS


def cmd_packs(args: argparse.Namespace) -> int:
    on = packs_on()
    declared = [e.source for e in extensions() if hasattr(e.module, "PACKS")]
    rows = [{"pack": pack.name, "on": pack.name in on, "summary": pack.summary,
             "requires": list(pack.requires), "commands": list(pack.commands)}
            for pack in PACKS]
    body = {"declaredIn": declared[0] if declared else None, "packs": rows}
    emit(body, lambda b: [
        f"packs from {b['declaredIn'] or 'no PACKS declared: every pack'}",
        *(f"  {'on ' if row['on'] else 'off'}  {row['pack']:<9} {row['summary']}"
          for row in b["packs"])])
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("packs", help="which of Sluice's packs are on, and what each brings")
    p.set_defaults(func=cmd_packs)


def leave_out(sub: argparse._SubParsersAction[Any]) -> None:
    """Take the commands of the packs that are off out of ``sub`` (parsing and help)."""
    on = packs_on()
    gone = {command for pack in PACKS if pack.name not in on for command in pack.commands}
    for command in gone:
        sub.choices.pop(command, None)
    sub._choices_actions = [a for a in sub._choices_actions if a.dest not in gone]
