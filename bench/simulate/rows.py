"""Which rows of the delivery policy (``sluice.delivery.policy.TABLE``) a run reached.

Every decision of the drain, the store and the operator's restarts goes through
``Policy.decide``, counted here by its row; the expiry asks ``decide`` once per drain
whatever it finds, so its row counts the entries ``DeliveryStore.expire`` failed; the
operator's pause, resume and disable (``sluice.ops.destinations.apply``), a pause's end
(``Destinations.lapse``), a purge (``DeliveryStore.purge``) and the entries of a channel
without an adapter set aside (``DeliveryStore.hold_unconfigured``) and an entry marked
delivered (``DeliveryStore.mark_delivered``) decide nothing by the
table, and are counted where they are done. ``--coverage`` prints the rows never reached.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ACTIONS = {"pause": "pause", "resume": "resume, or the pause's end", "disable": "disable"}


class Rows:
    def __init__(self) -> None:
        self.reached: Counter[str] = Counter()

    @contextmanager
    def installed(self) -> Iterator[None]:
        from sluice.delivery.destinations import Destinations
        from sluice.delivery.policy import DeliveryOutcome, Policy
        from sluice.delivery.store import DeliveryStore
        from sluice.ops import destinations as ops

        reached = self.reached
        saved = (Policy.decide, DeliveryStore.expire, DeliveryStore.purge, ops.apply,
                 Destinations.lapse, DeliveryStore.hold_unconfigured,
                 DeliveryStore.mark_delivered)
        decide, expire, purge, apply, lapse, hold, mark = saved

        def counted_decide(policy: Policy, outcome: DeliveryOutcome, **kwargs: Any) -> Any:
            if outcome is not DeliveryOutcome.EXPIRED:
                reached[outcome.value] += 1
            return decide(policy, outcome, **kwargs)

        def counted_expire(store: DeliveryStore, *args: Any, **kwargs: Any) -> Any:
            found = expire(store, *args, **kwargs)
            reached[DeliveryOutcome.EXPIRED.value] += sum(found.values())
            return found

        def counted_purge(store: DeliveryStore, *args: Any, **kwargs: Any) -> Any:
            reached[DeliveryOutcome.PURGE.value] += 1
            return purge(store, *args, **kwargs)

        def counted_apply(services: Any, change: Any, **kwargs: Any) -> Any:
            if change.action in ACTIONS:
                reached[ACTIONS[change.action]] += 1
            return apply(services, change, **kwargs)

        def counted_lapse(destinations: Destinations, *args: Any, **kwargs: Any) -> Any:
            found = lapse(destinations, *args, **kwargs)
            if found[0]:
                reached[DeliveryOutcome.RESUME.value] += found[0]
            return found

        def counted_hold(store: DeliveryStore, *args: Any, **kwargs: Any) -> Any:
            found = hold(store, *args, **kwargs)  # set aside by SQL, not by decide
            reached[DeliveryOutcome.NO_ADAPTER.value] += sum(found.values())
            return found

        def counted_mark(store: DeliveryStore, *args: Any, **kwargs: Any) -> Any:
            marked = mark(store, *args, **kwargs)  # one UPDATE, not by decide
            reached[DeliveryOutcome.MARK_DELIVERED.value] += 1
            return marked

        DeliveryStore.hold_unconfigured = counted_hold  # type: ignore[method-assign]
        DeliveryStore.mark_delivered = counted_mark  # type: ignore[method-assign]
        Policy.decide = counted_decide  # type: ignore[method-assign,assignment]
        DeliveryStore.expire = counted_expire  # type: ignore[method-assign]
        DeliveryStore.purge = counted_purge  # type: ignore[method-assign]
        ops.apply = counted_apply
        Destinations.lapse = counted_lapse  # type: ignore[method-assign]
        try:
            yield
        finally:
            (Policy.decide, DeliveryStore.expire, DeliveryStore.purge, ops.apply,  # type: ignore[method-assign]
             Destinations.lapse, DeliveryStore.hold_unconfigured,
             DeliveryStore.mark_delivered) = saved


def unreached(reached: Counter[str]) -> list[str]:
    """The policy's rows no decision of the run took, in the table's order."""
    from sluice.delivery.policy import TABLE

    return [outcome.value for outcome in TABLE if not reached[outcome.value]]
