"""Which delivery entry a crash hit, so an invariant forgives that entry, and only it.

A crash at a delivery point explains something about one entry: the one the drain had
just claimed (``delivery.after_claim``: its attempt counted, no request left, until its
lease lapses and the attempt is given back) or the one whose request had just left
(``delivery.after_send``, ``delivery.after_chunk``: an unknown outcome). Forgiving every
entry an attempt for every crash anywhere since its story (as ``no_attempt_burned`` once
did) forgives exactly the attempts a wrong policy row adds; these records let the
invariants forgive the entry the crash names, for as long as the crash explains it.

The claimed entry is observed, not guessed: ``DeliveryStore.claim`` is wrapped while the
simulation runs, and its last answer kept (the drain runs one send at a time here).

The drain marks a round of entries leaving in one statement and settles them together
after their sends (``DeliveryStore.requests_left``, ``DeliveryStore.settle``, both
wrapped too): a crash inside a round leaves every entry marked and not yet settled in
flight, its outcome unknown. Each is hit by that crash: one sent already may come again
(``in_round``: the engine counts it an unknown send), and one not yet sent has its
attempt counted with no request seen, forgiven for good (``left_marked``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.simulate.invariants import Match

CLAIMED_POINTS = ("delivery.after_claim", "delivery.after_enqueue")
SENT_POINTS = ("delivery.after_send", "delivery.after_chunk")


class Charges:
    def __init__(self, match_of: Callable[[Any], Match]) -> None:
        self.match_of = match_of
        self.claimed: list[Any] = []  # the drain's last claim
        self.hits: Counter[Match] = Counter()  # match -> crashes that hit its entry
        # entry id -> its attempts when a crash left it claimed with no request sent
        self.unsent: dict[str, int] = {}
        self.marked: dict[str, Any] = {}  # entry id -> entry: marked leaving, not settled
        self.left_marked: Counter[str] = Counter()  # entry id -> crashes inside its round
        self.in_round: list[Match] = []  # the matches the last crash left marked leaving

    def hit(self, point: str, last_request: Match | None) -> None:
        """A crash at ``point``: the entry it hit."""
        if point in CLAIMED_POINTS:
            for entry in self.claimed[:1]:  # the entry being sent when the run died
                self.hits[self.match_of(entry)] += 1
                self.unsent[entry.id] = entry.attempts
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

    def forgiven(self, entry: Any) -> int:
        """The attempts a crash explains on ``entry`` now: one, while it is still claimed by
        the run that died after claiming it (its lapse gives the attempt back)."""
        from sluice.delivery.store import DeliveryStatus

        marked = self.left_marked.get(entry.id, 0)
        if entry.status is DeliveryStatus.IN_FLIGHT and self.unsent.get(entry.id) == entry.attempts:
            return 1 + marked
        self.unsent.pop(entry.id, None)
        return marked

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
