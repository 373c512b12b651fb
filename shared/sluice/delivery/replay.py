"""Replay by destination and window: an operator sends again what one destination was sent,
or should have been, between two instants.

The filter (``parse_filter``, one for the API and the command line): a destination or
receiver key as entries carry it (``sluice.delivery.keys``: ``webhook:<URL>`` or
``webhook:<host>:<port>``, ``telegram:<chat>``, ``slack:<channel>``, ``email:smtp``), optionally its
channel, the window of enqueue times ``[since, until)`` (ISO 8601 with an offset; ``until``
defaults to now, is never in the future, and the window spans at most ``MAX_WINDOW``) and
the status to replay (``STATUSES``): ``failed`` (the default, every failure reason),
``expired`` (failed, reason ``expired``), ``acked`` or ``unknown``, each restarted as its
operator row of the policy says (``REPLAYS``).

A replay makes entries due and the drain sends them, so its rates and the destination's
health apply as to any entry; each entry starts afresh (attempts, unknown sends, expiry
and schedule: the store's one ``restart`` statement). The window is read ``BATCH`` entries
of the key a statement (selected by the keys each entry carries, never the other keys'
entries of the window) and each page's entries are restarted in one statement, however
many there are: a replay has no cap. A real run's audit row is written in the same
transaction as each page's restart (``AuditRow``): whatever stops it, the row holds the
filter, the count it reached and where to continue (``next``). Given a ``Deadline``, it
stops after the page that reaches it (at least one page a call) and answers ``next``:
the filter to send again, resuming after the last entry it read (``since`` that entry's
enqueue time to the microsecond, ``after`` its id).

Already acknowledged: the receiver acknowledged an entry's dedupe key when the entry is
``acked``, or when its key's effect record says the entry last seen under that key was
acked (delivered, then pruned). Only ``status: acked`` replays such an entry (its own row
acked); every other status leaves it, counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from sluice.core.crash import crash_point
from sluice.core.errors import RequestError
from sluice.core.times import iso_z
from sluice.core.validate import (
    MAX_LINE,
    check_identifier,
    check_instant,
    check_optional_identifier,
    refuse,
)
from sluice.delivery.channels import ChannelAdapter, Outbound, build_adapters
from sluice.delivery.destinations import check_key
from sluice.delivery.policy import OPERATOR_FROM, DeliveryOutcome, FailureReason
from sluice.delivery.store import DeliveryEntry, DeliveryStatus, DeliveryStore
from sluice.jobs.registry import Deadline
from sluice.jobs.runs import RunStore
from sluice.store.db import Tx, utcnow

if TYPE_CHECKING:
    from sluice.core.services import Services

BATCH = 500  # entries a statement: each page read, and each page's restart
MAX_WINDOW = timedelta(days=31)

# Each status a replay takes: the policy's operator row that restarts it (the status it
# starts from is that row's, ``OPERATOR_FROM``), and the failure reason it is narrowed to.
REPLAYS: dict[str, tuple[DeliveryOutcome, FailureReason | None]] = {
    "failed": (DeliveryOutcome.REDRIVE, None),
    "expired": (DeliveryOutcome.REDRIVE, FailureReason.EXPIRED),
    "acked": (DeliveryOutcome.REPLAY_ACKED, None),
    "unknown": (DeliveryOutcome.SEND_AGAIN, None),
}
STATUSES = tuple(REPLAYS)
DEFAULT_STATUS = "failed"
FIELDS = ("destination", "channel", "since", "until", "status", "after")


def exact(moment: datetime) -> str:
    """``moment`` in UTC to the microsecond: a continuation resumes exactly after its entry."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


class ReplayFilter(NamedTuple):
    destination: str
    since: datetime
    until: datetime
    status: str = DEFAULT_STATUS
    channel: str | None = None
    after: str | None = None  # of the entries enqueued at ``since``, only those after this id

    def to_json(self) -> dict[str, Any]:
        return {"destination": self.destination, "channel": self.channel,
                "since": iso_z(self.since), "until": iso_z(self.until), "status": self.status,
                "after": self.after}

    def to_body(self) -> dict[str, Any]:
        """The filter as the API's body (the command line's options) that asks for it again,
        its times to the microsecond."""
        return {**self.to_json(), "since": exact(self.since), "until": exact(self.until)}


def parse_filter(values: Mapping[str, Any], *, channels: Collection[str],
                 now: datetime | None = None) -> ReplayFilter:
    """The filter from the API's body or the command line's options (``FIELDS``, by their
    API names; None is left out): each value checked, every refusal a ``RequestError``
    naming its field."""
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise RequestError(f"unknown field(s): {', '.join(unknown)}; accepted: "
                           f"{', '.join(FIELDS)}", field=unknown[0])
    now = now or utcnow()
    destination = check_key(check_identifier(values.get("destination"), field="destination",
                                             limit=MAX_LINE))
    channel = values.get("channel")
    if channel is not None and (not isinstance(channel, str) or channel not in channels):
        raise refuse("channel", f"must be one of {', '.join(channels)}, got {channel!r}")
    status = values.get("status")
    if status is None:
        status = DEFAULT_STATUS
    if not isinstance(status, str) or status not in REPLAYS:
        raise refuse("status", f"must be one of {', '.join(STATUSES)}, got {status!r}")
    since = check_instant(values.get("since"), field="since")
    raw_until = values.get("until")
    until = now if raw_until is None else check_instant(raw_until, field="until")
    if until <= since:
        raise refuse("until", f"must be later than since ({iso_z(since)})")
    if until > now:
        raise refuse("until", f"is in the future ({iso_z(until)}; now is {iso_z(now)}): "
                              "leave it out to replay up to now")
    if until - since > MAX_WINDOW:
        raise refuse("since", f"opens a window of {until - since}; a replay spans at most "
                              f"{MAX_WINDOW.days} days (replay a longer one in parts)")
    after = check_optional_identifier(values.get("after"), field="after")
    return ReplayFilter(destination, since, until, status, channel, after)


class AuditRow(NamedTuple):
    """A real replay's audit row, written ``started`` before it runs: each page's restart
    writes the report so far into it, in the restart's own transaction."""

    runs: RunStore
    id: str
    detail: Mapping[str, Any] | None = None  # what the row holds beside the report

    def note(self, report: ReplayReport, tx: Tx | None = None) -> None:
        self.runs.progress_audit(self.id, {**(self.detail or {}), **report.to_json()}, tx=tx)


@dataclass
class ReplayReport:
    """What a replay did (a dry run: would do) to its destination's window."""

    filter: ReplayFilter
    dry_run: bool
    count: int = 0  # entries restarted (a dry run: that would be)
    chosen: int = 0  # entries chosen; those restarted meanwhile by someone else are not counted
    already_acknowledged: int = 0  # entries of the window whose key the receiver acknowledged
    skipped_acknowledged: int = 0  # of the status asked, left because already acknowledged
    window: Counter[str] = field(default_factory=Counter)  # the destination's entries, by status
    no_adapter: int = 0  # entries of the window of a channel without adapter (no destination)
    pages: int = 0  # statements that read the window
    batches: int = 0  # statements that restarted entries
    largest_batch: int = 0
    next: ReplayFilter | None = None  # what is left of the window, when it stopped short

    def to_json(self) -> dict[str, Any]:
        return {"filter": self.filter.to_json(), "dryRun": self.dry_run, "count": self.count,
                "alreadyAcknowledged": self.already_acknowledged,
                "skippedAcknowledged": self.skipped_acknowledged,
                "changedMeanwhile": self.chosen - self.count,
                "window": {status: self.window[status]
                           for status in ("failed", "expired", "acked", "unknown")},
                "noAdapter": self.no_adapter, "pages": self.pages, "batches": self.batches,
                "largestBatch": self.largest_batch,
                "next": None if self.next is None else self.next.to_body()}


class Replay:
    def __init__(self, store: DeliveryStore, adapters: Mapping[str, ChannelAdapter], *,
                 batch: int = BATCH) -> None:
        self.store = store
        self.adapters = adapters
        self.batch = batch

    @classmethod
    def from_services(cls, services: Services, client: Outbound, *,
                      batch: int = BATCH) -> Replay:
        """The configured channels' adapters name the destinations (no request is sent)."""
        return cls(DeliveryStore(services.db), build_adapters(services.settings, client),
                   batch=batch)

    def run(self, flt: ReplayFilter, *, dry_run: bool, deadline: Deadline | None = None,
            audit: AuditRow | None = None,
            progress: Callable[[ReplayReport], None] = lambda report: None) -> ReplayReport:
        """Page through ``flt``'s window and restart its destination's entries of the status
        asked (not with ``dry_run``), writing the report into ``audit`` with each page's
        restart; stop after the page that reaches ``deadline`` (``next``: what is left).
        ``progress`` sees the report after every page."""
        if flt.channel is not None and flt.channel not in self.adapters:
            raise refuse("channel", f"{flt.channel!r} has no adapter configured: its entries' "
                                    "destinations are not known, and no drain would send them")
        outcome, reason = REPLAYS[flt.status]
        [wanted] = OPERATOR_FROM[outcome]
        report = ReplayReport(flt, dry_run)
        after = (flt.since, flt.after or "")
        while True:
            page = self.store.window(flt.destination, flt.since, flt.until,
                                     channel=flt.channel, after=after, limit=self.batch)
            report.pages += 1
            if page:
                after = (page[-1].enqueued_at, page[-1].id)
            more = len(page) == self.batch
            report.next = flt._replace(since=after[0], after=after[1]) if more else None
            chosen = self._choose(page, flt, wanted, reason, report)
            report.chosen += len(chosen)
            self._restart(outcome, chosen, report, audit)
            progress(report)
            crash_point("replay.after_page")
            if not more or (deadline is not None and deadline.expired()):
                return report

    def _restart(self, outcome: DeliveryOutcome, chosen: list[str], report: ReplayReport,
                 audit: AuditRow | None) -> None:
        if report.dry_run:
            report.count += len(chosen)
            return
        if not chosen:
            if audit is not None:
                audit.note(report)
            return

        def noted(tx: Tx, restarted: int) -> None:
            report.count += restarted
            report.batches += 1
            report.largest_batch = max(report.largest_batch, len(chosen))
            if audit is not None:
                audit.note(report, tx)

        self.store.restart(outcome, chosen, then=noted)

    def _choose(self, page: list[DeliveryEntry], flt: ReplayFilter, wanted: str,
                reason: FailureReason | None, report: ReplayReport) -> list[str]:
        mine = []
        for entry in page:
            if entry.channel not in self.adapters:
                report.no_adapter += 1
            else:
                mine.append(entry)
        acked_before = self.store.acked_effects(
            [e.idempotency_key for e in mine
             if e.idempotency_key is not None and e.status is not DeliveryStatus.ACKED])
        chosen = []
        for entry in mine:
            report.window[entry.status.value] += 1
            if entry.failure_reason == FailureReason.EXPIRED:
                report.window["expired"] += 1
            acknowledged = (entry.status is DeliveryStatus.ACKED
                            or entry.idempotency_key in acked_before)
            report.already_acknowledged += acknowledged
            if entry.status != wanted or (reason is not None and entry.failure_reason != reason):
                continue
            if acknowledged and wanted != DeliveryStatus.ACKED:
                report.skipped_acknowledged += 1
                continue
            chosen.append(entry.id)
        return chosen


__all__ = ["BATCH", "FIELDS", "MAX_WINDOW", "REPLAYS", "STATUSES", "AuditRow", "Replay",
           "ReplayFilter", "ReplayReport", "exact", "parse_filter"]
