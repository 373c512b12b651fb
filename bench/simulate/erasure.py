"""Erasure requests through the real store, purged by the real ``erasure-purge``.

An operator files each request of the world (``ErasureStore.create`` with its grace
window, as ``POST /api/admin/erasure`` does) and cancels some within the window. The
user's AI calls go on afterwards (a client that still reports them, an entry waiting in
Redis through the purge): ``record_usage`` and ``ledger-redrive`` must drop them.

The invariants, from public state (the request as the API shows it) and from what the
world wrote (the subject's id, found wherever it is, not where Sluice's registry says):

- ``erased_in_time``: a request not cancelled is purged within ``PURGE_WITHIN`` after its
  grace window ends, when the store and Redis were up for that long;
- ``nothing_comes_back`` (the same name as for deliveries): once purged, nothing the
  world wrote for the subject is left: no text column of any table of the database holds
  the subject's id (``leftovers``: every table the schema has, found by reading
  ``sqlite_master``, not the erasure registry), and no Redis key or value does, after
  every later call of theirs and every erasure-purge and ledger-redrive run. Only the
  erasure's own record of the request may name them (``RECORD_OF_ERASURE``). A call of
  theirs made while the store was down waits in Redis's retry queue
  (``ai:ledger:retry:*``, docs/billing.md) for the store, where no tombstone can be read:
  it may name them there until the first ledger-redrive run that ends ``ok`` after that
  outage, which must drop it;
- ``not_before_grace``: no request is purged before its grace window ends, unless an
  operator confirmed it (docs/erasure.md: a confirm "purges one request now, skipping what
  is left of its grace window");
- ``confirm_honoured``: so a confirm within the window purges the subject at once: right
  after it, nothing the world wrote for them is left (``leftovers``, the same reading as
  ``nothing_comes_back``), whatever the request's status says;
- ``cancel_holds``: a cancelled request is never purged, and an operator's confirm of one
  (docs/erasure.md: 409) purges nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from bench.simulate.billing import owed_at
from bench.simulate.peers import Window
from bench.simulate.stores import holds_sql, tables_and_columns
from bench.simulate.world import ErasureCall

if TYPE_CHECKING:
    from bench.simulate.invariants import Judge

PURGE_WITHIN = timedelta(hours=2)  # erasure-purge runs hourly
RESCAN_EVERY = timedelta(hours=1)  # a subject seen clean is read again at most this often
# Where an erased subject's id may stay: the record that the erasure was asked for and
# done (docs/erasure.md: accountability, and the tombstone that keeps the data from
# being written again). Any other table, column or Redis key holding it is a leftover.
RECORD_OF_ERASURE = frozenset({("data_erasure_requests", "subject_user_id"),
                               ("erasure_tombstones", "subject_user_id")})


def leftovers(services: Any, redis: Any,
              wanted: dict[str, tuple[str, ...]]) -> dict[str, dict[str, int]]:
    """For each subject of ``wanted``, where their id, or the id of a record the world
    wrote for them (their ``written`` ids: their AI calls' entry ids, also as the first
    part of a ``:``-suffixed id), still is: ``table.column`` (rows holding it) and
    ``redis:<key>`` (entries naming it), read from the database's own schema and every
    Redis key, so a table Sluice does not know holds personal data is found too. All the
    subjects in one pass over each table and the keys (a year's tables are large: one
    pass a subject was a third of a seed's time)."""
    import json

    subjects = sorted(wanted)
    found: dict[str, dict[str, int]] = {subject: {} for subject in subjects}
    if not subjects:
        return found
    params: dict[str, str] = {}
    for k, subject in enumerate(subjects):
        params[f"s{k}"] = subject
        params[f"ids{k}"] = json.dumps(sorted(wanted[subject]))
    with services.db.transaction() as tx:
        for table, every in tables_and_columns(tx).items():
            columns = [c for c in every if (table, c) not in RECORD_OF_ERASURE]
            if not columns:
                continue
            # one scan of the table, a count per subject and column (an id, or an id's
            # ``:``-suffixed form, is a short value: a long text, a run's result, is only
            # searched for the subject)
            sums = [f"{holds_sql(tx, c, k)} AS c{k}_{n}"
                    for n, c in enumerate(columns) for k in range(len(subjects))]
            row = tx.fetchone(f'SELECT {", ".join(sums)} FROM "{table}"', params)
            for k, subject in enumerate(subjects):
                for n, column in enumerate(columns):
                    if row and row[f"c{k}_{n}"]:
                        found[subject][f"{table}.{column}"] = int(row[f"c{k}_{n}"])
    if redis is not None:
        raw = getattr(redis, "client", redis)  # the server, not the prefixed view
        for key in raw.scan_iter("*"):
            kind = raw.type(key)
            values = [str(value) for value in (
                raw.lrange(key, 0, -1) if kind == "list"
                else [raw.get(key)] if kind == "string" else [])]
            for subject in subjects:
                hits = sum(subject in value for value in [str(key), *values])
                if hits:
                    found[subject][f"redis:{key}"] = hits
    return found


class Erasures:
    """A subject may be named by a second call while their first request is still open:
    the API hands back that open request (not a second one), so the call follows it: its
    grace window, and a cancel of the first call cancels it for both."""

    def __init__(self, judge: Judge, services: Any, log: Callable[[str], None],
                 reschedule: Callable[[datetime, ErasureCall], None] = lambda at, call: None,
                 windows: list[Window] | None = None, end: datetime | None = None) -> None:
        self.judge = judge
        self.services = services
        self.log = log
        self.reschedule = reschedule  # a check owed later than the call's own window says
        self.windows = windows or []
        self.end = end
        self.of_call: dict[ErasureCall, str] = {}  # call -> the request the API gave it
        self.ids: dict[str, str] = {}  # subject -> their latest request's id
        self.requests: dict[str, str] = {}  # request id -> subject
        self.purged: set[str] = set()  # subjects seen purged
        self.cancelled: set[str] = set()  # request ids
        self.grace_until: dict[str, datetime] = {}  # request id -> its window's end
        self.confirmed: dict[str, datetime] = {}  # request id -> when the operator confirmed
        self.redis: Any = None  # the Redis the deployment writes to (the harness's view)
        # A purged subject's leftovers are read again only once something could have
        # written them: a call of theirs, or a ledger-redrive or erasure-purge run that did
        # work (``touch``); a year's tables are large, and a scan of them all costs.
        self.epoch = 0
        self.scanned: dict[str, tuple[int, int]] = {}  # subject -> (epoch, calls) when clean
        self.called_at: Callable[[str, datetime], list[datetime]] = lambda subject, at: []
        self.redrive_ok: datetime | None = None  # the last ledger-redrive run ended ok
        self.last_scan: dict[str, datetime] = {}
        # the ids of the records the world wrote for a subject by a moment (their calls)
        self.written: Callable[[str, datetime], tuple[str, ...]] = lambda subject, at: ()

    def request(self, call: ErasureCall) -> None:
        from sluice.erasure.requests import ErasureStore

        request, created = ErasureStore(self.services.db).create(
            call.subject, requested_by="sim-operator", grace_days=call.grace_days,
            tenant_id=call.tenant_id)
        self.of_call[call] = request.id
        # the world's own clock: the grace window it asked for (the first request's, when
        # the API handed back one open already)
        self.grace_until.setdefault(request.id, call.at + timedelta(days=call.grace_days))
        self.ids[call.subject] = request.id
        self.requests[request.id] = call.subject
        self.log(f"erasure of {call.subject} requested (grace {call.grace_days} d)"
                 f"{'' if created else ': one was open already'}")

    def cancel(self, call: ErasureCall) -> None:
        from sluice.core.errors import Conflict
        from sluice.erasure.requests import ErasureStore

        request_id = self.of_call[call]
        try:
            ErasureStore(self.services.db).cancel(request_id)
        except Conflict as exc:  # purged or cancelled already: the operator was too late
            self.log(f"erasure of {call.subject}: not cancelled ({exc.message})")
            return
        self.cancelled.add(request_id)
        self.log(f"erasure of {call.subject} cancelled")

    def confirm(self, call: ErasureCall, at: datetime) -> None:
        """The operator confirms the request (``POST …/requests/{id}/confirm``): one in its
        window is purged now (``confirm_honoured``), one cancelled is refused (409)."""
        from bench.simulate.crashes import SimCrash
        from sluice.core.errors import Conflict
        from sluice.erasure.purge import confirm

        request_id = self.of_call[call]
        try:
            confirm(self.services, request_id, confirmed_by="sim-operator")
        except Conflict as exc:
            self.log(f"erasure of {call.subject}: confirm refused ({exc.message})")
        except SimCrash as crash:  # the request's process died: the next run sweeps
            self.log(f"erasure of {call.subject}: the confirm crashed at {crash.point}")
            if request_id not in self.cancelled:
                self.confirmed.setdefault(request_id, at)
            return
        else:
            self.log(f"erasure of {call.subject} confirmed by the operator")
        if request_id in self.cancelled:
            return  # refused, as documented: cancel_holds judges what the store shows
        self.confirmed.setdefault(request_id, at)
        written = self.written(call.subject, at)
        left = leftovers(self.services, self.redis, {call.subject: written})[call.subject]
        if self._waiting(call.subject, at):
            left = {where: n for where, n in left.items() if ":ai:ledger:retry:" not in where}
        if left:
            self.judge.fail("confirm_honoured", at,
                            f"the operator confirmed the erasure of {call.subject} (request "
                            f"{request_id}); right after it their data is still there: {left}")

    def due(self, call: ErasureCall, windows: list[Window], end: datetime) -> datetime | None:
        """When the purge is owed: the first ``PURGE_WITHIN`` clear of outages from the end
        of the grace window on (None for a cancelled request, or one past the run)."""
        if call.cancel_at is not None:
            return None
        return owed_at(call.at + timedelta(days=call.grace_days), windows, end, PURGE_WITHIN)

    def check_purged(self, call: ErasureCall, at: datetime) -> None:
        from sluice.erasure.requests import ErasureStore

        request_id = self.of_call.get(call)
        if request_id in self.cancelled:
            self.log(f"erasure of {call.subject}: its request was cancelled through an "
                     "earlier call; nothing owed")
            return
        if request_id is not None and self.end is not None:
            # the request handed back may be an earlier one, whose window ends later
            request = ErasureStore(self.services.db).get(request_id)
            due = owed_at(request.grace_until, self.windows, self.end, PURGE_WITHIN)
            if request.status.value == "requested" and (due is None or due > at):
                if due is not None:
                    self.reschedule(due, call)
                return
        status = self._status(request_id)
        if status != "purged":
            self.judge.fail("erased_in_time", at, f"erasure of {call.subject} is {status} "
                            f"{PURGE_WITHIN} after its grace window ended")

    def check(self, at: datetime, *, final: bool = False) -> None:
        """Every request as the API shows it: purged ones stay empty, cancelled stay so.
        A subject seen clean is read again once something could have written them, at most
        every ``RESCAN_EVERY`` (``final``: now, at the end of the run); the subjects due
        are read together."""
        due: dict[str, tuple[str, tuple[str, ...]]] = {}
        for request_id, subject in sorted(self.requests.items()):
            status = self._status(request_id)
            if status == "purged" and request_id in self.cancelled:
                self.judge.fail("cancel_holds", at, f"erasure of {subject} was cancelled, "
                                "then purged")
            if status != "purged":
                continue
            grace = self.grace_until.get(request_id)
            if (subject not in self.purged and grace is not None and at < grace
                    and request_id not in self.confirmed):
                self.judge.fail("not_before_grace", at,
                                f"erasure of {subject} purged before its grace window "
                                f"ended ({grace:%Y-%m-%d %H:%M})")
            self.purged.add(subject)
            written = self.written(subject, at)
            if self.scanned.get(subject) == (self.epoch, len(written)):
                continue  # nothing could have written them since they were seen clean
            last = self.last_scan.get(subject)
            if not final and last is not None and at - last < RESCAN_EVERY:
                continue  # read within the hour: a later check reads again
            self.last_scan[subject] = at
            due[subject] = (request_id, written)
        found = leftovers(self.services, self.redis,
                          {subject: written for subject, (_, written) in due.items()})
        for subject, (request_id, written) in due.items():
            left = found[subject]
            if self._waiting(subject, at):
                left = {where: n for where, n in left.items() if ":ai:ledger:retry:" not in where}
            if not left:
                self.scanned[subject] = (self.epoch, len(written))
            if left:
                self.judge.fail("nothing_comes_back", at,
                                f"{subject} was erased (request {request_id}); rows are back: "
                                f"{left}")

    def _waiting(self, subject: str, at: datetime) -> bool:
        """A call of ``subject`` made while the store was down may still wait in Redis: no
        ledger-redrive run ended ok since that outage ended."""
        for moment in self.called_at(subject, at):
            for window in self.windows:
                if (window.kind == "store_down" and window.start <= moment < window.end
                        and (self.redrive_ok is None or self.redrive_ok < window.end)):
                    return True
        return False

    def touch(self) -> None:
        """A run that may have written anything (a redrive that drained, a purge) ended."""
        self.epoch += 1

    def erased(self, subject: str) -> bool:
        return subject in self.purged or self._status(self.ids.get(subject)) == "purged"

    def _status(self, request_id: str | None) -> str:
        from sluice.erasure.requests import ErasureStore

        if request_id is None:
            return "none"
        return ErasureStore(self.services.db).get(request_id).status.value
