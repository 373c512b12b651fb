"""Erasure requests through the real store, purged by the real ``erasure-purge``.

An operator files each request of the world (``ErasureStore.create`` with its grace
window, as ``POST /api/admin/erasure`` does) and cancels some within the window. The
user's AI calls go on afterwards (a client that still reports them, an entry waiting in
Redis through the purge): ``record_usage`` and ``ledger-redrive`` must drop them.

The invariants, from public state (the request as the API shows it; the subject's rows as
the purge's own verification counts them in the SQL store):

- ``erased_in_time``: a request not cancelled is purged within ``PURGE_WITHIN`` after its
  grace window ends, when the store and Redis were up for that long;
- ``nothing_comes_back`` (the same name as for deliveries): once purged, the subject has
  no row left in any registered table, after every later call of theirs and every
  erasure-purge and ledger-redrive run;
- ``cancel_holds``: a cancelled request is never purged.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from bench.simulate.billing import owed_at
from bench.simulate.peers import Window
from bench.simulate.world import ErasureCall

if TYPE_CHECKING:
    from bench.simulate.invariants import Judge

PURGE_WITHIN = timedelta(hours=2)  # erasure-purge runs hourly


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

    def request(self, call: ErasureCall) -> None:
        from sluice.erasure.requests import ErasureStore

        request, created = ErasureStore(self.services.db).create(
            call.subject, requested_by="sim-operator", grace_days=call.grace_days,
            tenant_id=call.tenant_id)
        self.of_call[call] = request.id
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

    def check(self, at: datetime) -> None:
        """Every request as the API shows it: purged ones stay empty, cancelled stay so."""
        from sluice.erasure.purge import count_subject

        for request_id, subject in sorted(self.requests.items()):
            status = self._status(request_id)
            if status == "purged" and request_id in self.cancelled:
                self.judge.fail("cancel_holds", at, f"erasure of {subject} was cancelled, "
                                "then purged")
            if status != "purged":
                continue
            self.purged.add(subject)
            left = {name: n for name, n in count_subject(self.services, subject).items()
                    if n and not name.startswith("redis")}
            if left:
                self.judge.fail("nothing_comes_back", at,
                                f"{subject} was erased (request {request_id}); rows are back: "
                                f"{left}")

    def erased(self, subject: str) -> bool:
        return subject in self.purged or self._status(self.ids.get(subject)) == "purged"

    def _status(self, request_id: str | None) -> str:
        from sluice.erasure.requests import ErasureStore

        if request_id is None:
            return "none"
        return ErasureStore(self.services.db).get(request_id).status.value
