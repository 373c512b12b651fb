"""How long an alert's effect record lives: as long as its story can come back.

Every match enqueued once has a ``delivery_effects`` row (written with its delivery
entry, see ``DeliveryStore.enqueue``) that the delivery retention never deletes: the
sweep re-reads every story of a build on every tick, so without it a match would be
alerted again each time its entry is pruned. The record goes only when all of these
hold: its story is stored by no source (``rss_stories`` keeps the newest 200 per
source, so no build made from now on can hold it), no sweep or new-story evaluation
has seen the match for ``KEEP`` (stored builds live far less; a feed that drops an item
and lists it again within that window does not re-arm it), and its delivery entry is
gone. So the table holds at most, per scope, rules x stories stored for its sources
(100 x 200 per source), plus the matches of the last ``KEEP``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from sluice.store.db import Database, Queries, utcnow

Q = Queries.parse((Path(__file__).parent / "effects.sql").read_text())

PRODUCER = "alert"
KEEP = timedelta(days=30)
TOUCH_EVERY = timedelta(days=1)


def touch_effects(db: Database, keys: list[str], *, now: datetime | None = None) -> None:
    """The matches were seen again: keep their records (one write a day at most)."""
    now = now or utcnow()
    with db.transaction() as tx:
        tx.execute(Q.touch, {"keys": tx.json(keys), "now": now,
                             "stale": now - TOUCH_EVERY}, final=True)


def prune_effects(db: Database, *, now: datetime | None = None, limit: int = 1000) -> int:
    """Delete the records whose story can no longer appear in a build (see the module)."""
    now = now or utcnow()
    with db.transaction() as tx:
        return tx.execute(Q.prune, {"before": now - KEEP, "limit": limit}, final=True)
