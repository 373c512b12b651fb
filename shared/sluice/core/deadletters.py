"""Dead letters, whatever holds them: one ``DeadLetterSource`` protocol, one backend per store.

A source lists its letters newest first, shows one, redrives some (each one vetted
first: a letter that may not go back is refused with a reason and stays), purges
some or all, and says how many it holds. The operations layer keeps the table of
sources and adds the caps, the pacing and the audit trail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from sluice.core.errors import RequestError


class RedriveRefused(RequestError):
    """This dead letter may not be redriven."""

    code = "redrive_refused"


@dataclass
class DeadLetter:
    id: str
    queue: str
    reason: str
    failed_at: str | None
    body: dict[str, Any]
    raw: str = ""
    handle: str | None = field(default=None, repr=False)  # a receipt handle, while held
    aliases: tuple[str, ...] = ()  # other ids it answers to (an original message id)

    def age_s(self, now: datetime) -> float | None:
        if not self.failed_at:
            return None
        try:
            at = datetime.fromisoformat(self.failed_at)
        except ValueError:
            return None
        return round((now - at.astimezone(UTC)).total_seconds(), 3)

    def to_dict(self, now: datetime, *, full: bool = False) -> dict[str, Any]:
        item: dict[str, Any] = {"id": self.id, "queue": self.queue, "reason": self.reason,
                                "failedAt": self.failed_at, "ageSeconds": self.age_s(now),
                                "deliveryCount": self.body.get("deliveryCount",
                                                               self.body.get("attempts"))}
        if full:
            item["body"] = self.body
        return item

    def answers_to(self, wanted: set[str]) -> bool:
        return self.id in wanted or any(alias in wanted for alias in self.aliases)


@dataclass
class RedriveReport:
    redriven: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)


class DeadLetterSource(Protocol):
    name: str

    def show(self, entry_id: str) -> DeadLetter | None: ...

    def redrive(self, ids: list[str] | None, limit: int, *, dry_run: bool,
                pace: Callable[[], None]) -> RedriveReport: ...

    def purge(self, ids: list[str] | None) -> int: ...

    def depth(self) -> int: ...

    def list(self, limit: int) -> list[DeadLetter]: ...


def newest_first(letters: Iterable[DeadLetter]) -> list[DeadLetter]:
    return sorted(letters, key=lambda d: d.failed_at or "", reverse=True)


def choose(letters: list[DeadLetter], ids: list[str] | None, limit: int) -> list[DeadLetter]:
    """The first ``limit`` letters, or those answering to one of ``ids``."""
    if ids is None:
        return letters[:limit]
    wanted = set(ids)
    return [d for d in letters if d.answers_to(wanted)]


def missing(chosen: list[DeadLetter], ids: list[str] | None) -> list[str]:
    if ids is None:
        return []
    seen = {d.id for d in chosen} | {a for d in chosen for a in d.aliases}
    return [i for i in ids if i not in seen]


def redrive_each(chosen: list[DeadLetter], ids: list[str] | None, *, dry_run: bool,
                 pace: Callable[[], None], vet: Callable[[DeadLetter], str | None],
                 send: Callable[[DeadLetter], dict[str, Any]],
                 on_error: Callable[[DeadLetter, Exception], None]) -> RedriveReport:
    """Vet each letter (a reason refuses it), then send it unless this is a dry run.

    ``pace`` runs between two sends. A failure of one letter is recorded and the
    rest go on.
    """
    report = RedriveReport(not_found=missing(chosen, ids))
    sent = 0
    for letter in chosen:
        reason = vet(letter)
        if reason is not None:
            report.refused.append({"id": letter.id, "reason": reason})
            continue
        if dry_run:
            report.redriven.append({"id": letter.id, "reason": letter.reason})
            continue
        if sent:
            pace()
        sent += 1
        try:
            report.redriven.append(send(letter))
        except RedriveRefused as exc:
            report.refused.append({"id": letter.id, "reason": exc.message})
        except Exception as exc:  # noqa: BLE001 - one bad letter must not stop the rest
            report.failed.append({"id": letter.id, "error": str(exc)[:500]})
            on_error(letter, exc)
    return report
