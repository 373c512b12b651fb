"""Which delivery entries a stopped drain run left claimed, so an invariant forgives those
entries, and only them, for as long as the stop explains them.

A drain claims a batch and sends it in order (``CLAIM_BATCH``, one worker here). A run that
stops before it has settled its claim (a crash at a delivery point, a dependency failing in
a way it does not expect, the store failing) leaves every entry of that claim it had not
settled in flight: its attempt counted, no request left, until its lease lapses and the
next drain gives the attempt back. That is one attempt per such entry, and nothing more:
``forgiven`` answers one only while the entry is still in flight under that very claim
(its attempts and lease end as the claim left them) with no request left, and nothing
once anything else happened to it. Forgiving an attempt for every crash anywhere since an
entry's story (as ``no_attempt_burned`` once did) forgave exactly the attempts a wrong
policy row adds.

A crash also names one entry (``hits``): the one whose turn it was (``delivery.after_claim``:
the claim's first, which Sluice counts the lapse against) or the one whose request had just
left (``delivery.after_send``, ``delivery.after_chunk``: an unknown outcome). Only that
entry's failure for good may the crash justify.

The claims are observed, not guessed: ``DeliveryStore.claim`` is wrapped while the
simulation runs, and the running drain's last answer kept (``begin`` forgets the last
run's). The inline send (``delivery.after_enqueue``) is not simulated: a crash there would
name no entry, so it forgives nothing.

The drain marks a round of entries leaving in one statement and settles them together
after their sends (``DeliveryStore.requests_left``, ``DeliveryStore.settle``, both
wrapped too): a crash inside a round leaves every entry marked and not yet settled in
flight, its outcome unknown. Each is named by that crash too: one sent already may come
again (``in_round``: the engine counts it an unknown send), and one not yet sent has its
attempt counted with no request seen, forgiven for good (``left_marked``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from bench.simulate.invariants import Match

CLAIMED_POINTS = ("delivery.after_claim",)
SENT_POINTS = ("delivery.after_send", "delivery.after_chunk")


class Charges:
    def __init__(self, match_of: Callable[[Any], Match]) -> None:
        self.match_of = match_of
        self.claimed: list[Any] = []  # the running drain's last claim, in its sending order
        self.hits: Counter[Match] = Counter()  # match -> crashes that named its entry
        self.held: Counter[Match] = Counter()  # match -> stopped runs that held its entry
        # entry id -> (attempts, lease end) as a stopped run's claim left it, unsent
        self.unsent: dict[str, tuple[int, datetime | None]] = {}
        self.marked: dict[str, Any] = {}  # entry id -> entry: marked leaving, not settled
        self.left_marked: Counter[str] = Counter()  # entry id -> crashes inside its round
        self.in_round: list[Match] = []  # the matches the last crash left marked leaving

    def begin(self) -> None:
        """A drain run begins: it holds nothing yet."""
        self.claimed = []
        self.marked = {}

    def hit(self, point: str, last_request: Match | None) -> None:
        """A crash at ``point``: the entry it names."""
        if point in CLAIMED_POINTS:
            for entry in self.claimed[:1]:  # the entry whose turn came first
                self.hits[self.match_of(entry)] += 1
        elif point in SENT_POINTS and last_request is not None:
            self.hits[last_request] += 1
        self.in_round = []
        if point in SENT_POINTS:
            for entry in self.marked.values():
                match = self.match_of(entry)
                if match != last_request:
                    self.hits[match] += 1
                    self.left_marked[entry.id] += 1
                    self.in_round.append(match)
        self.marked = {}

    def stopped(self, current: Callable[[str], Any]) -> None:
        """The running drain stopped (a crash, a job error, the store failing): each entry
        of its claim that ``current`` (the entry as the store has it now) shows still held
        as claimed, no request left, stays so until its lease lapses."""
        for entry in self.claimed:
            now = current(entry.id)
            if self._unsent(now, (entry.attempts, entry.lease_until)):
                self.held[self.match_of(entry)] += 1
                self.unsent[entry.id] = (entry.attempts, entry.lease_until)
        self.claimed = []

    def forgiven(self, entry: Any) -> int:
        """The attempts a stop explains on ``entry`` now: one, while it is still in flight
        under the claim of the run that stopped holding it, no request left (its lapse
        gives the attempt back); and one for each crash that left it marked leaving in a
        round, unsettled (its attempt counts, whether or not its request left)."""
        marked = self.left_marked.get(entry.id, 0)
        if self._unsent(entry, self.unsent.get(entry.id)):
            return 1 + marked
        self.unsent.pop(entry.id, None)
        return marked

    @staticmethod
    def _unsent(entry: Any, claimed: tuple[int, datetime | None] | None) -> bool:
        """``entry`` is in flight under the claim that left it ``claimed``, unsent."""
        from sluice.delivery.store import DeliveryStatus

        return (entry is not None and entry.status is DeliveryStatus.IN_FLIGHT
                and entry.request_left_at is None
                and claimed == (entry.attempts, entry.lease_until))

    @contextmanager
    def installed(self) -> Iterator[None]:
        from sluice.delivery.store import DeliveryStore

        original, marking, settling = (DeliveryStore.claim, DeliveryStore.requests_left,
                                       DeliveryStore.settle)
        charges = self

        def claim(store: DeliveryStore, *args: Any, **kwargs: Any) -> list[Any]:
            charges.claimed = original(store, *args, **kwargs)
            return charges.claimed

        def requests_left(store: DeliveryStore, entries: Any, **kwargs: Any) -> set[str]:
            marked = marking(store, entries, **kwargs)
            charges.marked.update((e.id, e) for e in entries if e.id in marked)
            return marked

        def settle(store: DeliveryStore, settles: Any) -> list[bool]:
            done = settling(store, settles)
            for s in settles:
                charges.marked.pop(s.entry.id, None)
            return done

        DeliveryStore.claim = claim  # type: ignore[method-assign]
        DeliveryStore.requests_left = requests_left  # type: ignore[method-assign]
        DeliveryStore.settle = settle  # type: ignore[method-assign]
        try:
            yield
        finally:
            DeliveryStore.claim = original  # type: ignore[method-assign]
            DeliveryStore.requests_left = marking  # type: ignore[method-assign]
            DeliveryStore.settle = settling  # type: ignore[method-assign]
