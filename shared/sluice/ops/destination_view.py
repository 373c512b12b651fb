"""The destinations view: the destinations Sluice knows (those its entries go to, and those
it holds a state for), a page at a time in key order (``Page``: at most ``limit``, after a
key, of one state), each with its state (``ok``, ``failing`` since when, ``paused`` until
when, ``disabled`` since when and why), its entries waiting, in flight, failed and unknown,
its last error and last success, and the rates in force (the settings', or an operator's
override until its time). ``GET /api/admin/delivery/destinations`` and ``sluice delivery
destinations`` answer it; the console shows the ones held and the busiest (``busiest``).

A page reads the keys it shows (the state rows in key order, the receivers entries name by
a skip scan of their index) and the entries of those keys, never every destination: its
cost does not grow with the destinations Sluice knows.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from sluice.core.errors import RequestError
from sluice.core.times import iso_z, iso_z_or_none
from sluice.delivery.channels import channels
from sluice.delivery.destinations import MAX_KEY_LENGTH
from sluice.delivery.ratelimit import Override, limits_for, read_overrides
from sluice.store.db import Row, load_queries, utcnow

if TYPE_CHECKING:
    from sluice.core.services import Services

Q = load_queries("delivery")
STATES = ("ok", "failing", "paused", "disabled")
DEFAULT_LIMIT, MAX_LIMIT = 100, 1000  # destinations a page of the view
# A page of one state reads at most this many times its limit of keys before it answers
# (with ``next``): a page of ok destinations among thousands held stays bounded.
SCAN_PAGES = 10


class _Seen(NamedTuple):
    """What the queue holds for one destination."""

    channel: str | None
    recipient: str | None
    counts: dict[str, int]
    last_acked: datetime | None


def _time(value: Any) -> datetime | None:
    if isinstance(value, str):  # SQLite does not type aggregates
        return datetime.fromisoformat(value).astimezone(UTC)
    return value if isinstance(value, datetime) else None


def _seen(services: Services, keys: list[str]) -> dict[str, _Seen]:
    """Per key of ``keys``, what the queue holds: its entries as a receiver, or as a
    destination that is not its own receiver (both read from the keys each entry carries
    from its enqueue, so an entry no drain has taken yet is counted)."""
    with services.db.transaction() as tx:
        listed = tx.json(keys)
        rows = [*tx.fetchall(Q.receiver_summary, {"keys": listed}),
                *tx.fetchall(Q.destination_summary, {"keys": listed})]
    found: dict[str, _Seen] = {}
    for row in rows:
        seen = found.get(row["key"])
        counts = dict(seen.counts) if seen else {}
        counts[row["status"]] = int(row["n"])
        acked = _time(row["last_acked"])
        last = max((t for t in (seen.last_acked if seen else None, acked) if t), default=None)
        found[row["key"]] = _Seen(row["channel"], row["recipient"], counts, last)
    return found


def _sample(key: str, seen: _Seen | None) -> tuple[str | None, str | None]:
    """A channel and recipient that go to ``key``: one of its entries', else read from
    the key of a channel that keys by recipient."""
    if seen is not None and seen.channel is not None:
        return seen.channel, seen.recipient
    channel, _, rest = key.partition(":")
    if channel in ("telegram", "slack"):
        return channel, rest
    if channel == "webhook":
        host, _, port = rest.rpartition(":")
        host = f"[{host}]" if ":" in host else host
        return channel, f"https://{host}{':' + port if port else ''}/"
    return (channel if channel in channels() else None), None


def _row_json(key: str, row: Row | None, seen: _Seen | None, services: Services,
              overrides: dict[str, Override], now: datetime, threshold: int) -> dict[str, Any]:
    counts = seen.counts if seen else {}
    down_since = _time(row["down_since"]) if row else None
    paused_until = _time(row["paused_until"]) if row else None
    disabled_at = _time(row["disabled_at"]) if row else None
    paused = paused_until is not None and paused_until > now
    failures = int(row["failures"]) if row else 0
    state = ("disabled" if disabled_at else "paused" if paused
             else "failing" if down_since else "ok")
    channel, recipient = _sample(key, seen)
    override = overrides.get(key)
    rates = ([] if channel is None or recipient is None else
             [limit.to_json() for limit in limits_for(channel, recipient, services.settings,
                                                      override)])
    if not rates and override is not None:  # an app channel's destination: its own rate
        rates = [{"key": f"destination:{key}", "limit": override.limit, "per": override.per,
                  "source": "override", "until": iso_z(override.until)}]
    successes = [t for t in ((_time(row["last_success_at"]) if row else None),
                             seen.last_acked if seen else None) if t]
    return {
        "key": key, "channel": channel, "state": state,
        "since": iso_z_or_none(disabled_at if state == "disabled" else
                               _time(row["paused_at"]) if state == "paused" and row else
                               down_since if state == "failing" else None),
        "until": iso_z_or_none(paused_until) if paused else None,
        "failing": None if down_since is None else {
            "since": iso_z(down_since), "failures": failures, "down": failures >= threshold,
            "nextProbeAt": iso_z_or_none(_time(row["next_probe_at"]) if row else None)},
        "paused": None if not paused else {
            "since": iso_z_or_none(_time(row["paused_at"]) if row else None),
            "until": iso_z_or_none(paused_until)},
        "disabled": None if disabled_at is None else {
            "since": iso_z(disabled_at), "reason": row["disabled_reason"] if row else None},
        "waiting": counts.get("pending", 0), "inFlight": counts.get("in_flight", 0),
        "failed": counts.get("failed", 0), "unknown": counts.get("unknown", 0),
        "lastError": row["last_error"] if row else None,
        "lastSuccess": iso_z_or_none(max(successes, default=None)),
        "rates": rates,
        "rateOverride": None if override is None else {
            "limit": override.limit, "per": override.per, "until": iso_z(override.until)},
    }


class Page(NamedTuple):
    """Which destinations a view shows: at most ``limit``, keys after ``after``, of
    ``state`` when given."""

    state: str | None = None
    limit: int = DEFAULT_LIMIT
    after: str | None = None


def parse_page(values: Mapping[str, Any]) -> Page:
    """The page from the API's query (``state``, ``limit``, ``after``) or the command
    line's options: each checked, a refusal a 400 naming its field."""
    state, raw_limit, after = (values.get(name) for name in ("state", "limit", "after"))
    if state is not None and state not in STATES:
        raise RequestError(f"state must be one of {', '.join(STATES)}, got {state!r}",
                           field="state")
    if raw_limit is None:
        limit = DEFAULT_LIMIT
    elif isinstance(raw_limit, str) and raw_limit.isdigit() and 1 <= int(raw_limit) <= MAX_LIMIT:
        limit = int(raw_limit)
    else:
        raise RequestError(f"limit must be a whole number from 1 to {MAX_LIMIT}",
                           field="limit")
    if after is not None and (not isinstance(after, str) or not after.isprintable()
                              or not 0 < len(after) <= MAX_KEY_LENGTH):
        raise RequestError("after is a destination's key, as a page's next names it",
                           field="after")
    return Page(state, limit, after)


def _keys(services: Services, page: Page, after: str, now: datetime) -> list[str]:
    """The next ``page.limit`` keys after ``after`` that may be in the page's state."""
    params = {"after": after, "limit": page.limit, "state": page.state, "now": now}
    with services.db.transaction() as tx:
        keys = {row["key"] for row in tx.fetchall(Q.destination_keys, {
            **params, "state": None if page.state == "ok" else page.state})}
        if page.state in (None, "ok"):  # a key in another state has a row: found above
            keys.update(row["key"] for row in tx.fetchall(Q.receiver_keys, params))
    return sorted(keys)[:page.limit]


def _described(services: Services, keys: list[str], now: datetime,
               overrides: dict[str, Override]) -> list[dict[str, Any]]:
    """Each of ``keys`` as the view shows it, in their order (four statements for all)."""
    if not keys:
        return []
    with services.db.transaction() as tx:
        rows = {row["key"]: row
                for row in tx.fetchall(Q.destinations_among, {"keys": tx.json(keys)})}
    seen = _seen(services, keys)
    threshold = services.settings.delivery_outage_threshold
    return [_row_json(key, rows.get(key), seen.get(key), services, overrides, now, threshold)
            for key in keys]


def view(services: Services, page: Page | None = None, *, now: datetime | None = None
         ) -> dict[str, Any]:
    """One page of the destinations, by key: ``destinations``, ``count`` (on this page) and
    ``next`` (the ``after`` of the next page; None after the last)."""
    page, now = page or Page(), now or utcnow()
    overrides = read_overrides(services.db, now)
    shown: list[dict[str, Any]] = []
    after = page.after or ""
    for _ in range(SCAN_PAGES):
        keys = _keys(services, page, after, now)
        for found in _described(services, keys, now, overrides):
            if page.state is None or found["state"] == page.state:
                shown.append(found)
            if len(shown) == page.limit:
                return {"destinations": shown, "count": len(shown), "next": found["key"]}
        if len(keys) < page.limit:
            return {"destinations": shown, "count": len(shown), "next": None}
        after = keys[-1]
    return {"destinations": shown, "count": len(shown), "next": after}


def busiest(services: Services, limit: int, *, now: datetime | None = None
            ) -> list[dict[str, Any]]:
    """At most ``limit`` receivers that are ``ok``, those with the most entries waiting or
    failed first (the console's list beside the ones held)."""
    now = now or utcnow()
    with services.db.transaction() as tx:
        keys = [row["key"] for row in tx.fetchall(Q.busiest_receivers, {"limit": limit})]
    return [found for found in _described(services, keys, now,
                                          read_overrides(services.db, now))
            if found["state"] == "ok"]


def describe(services: Services, key: str, *, now: datetime | None = None) -> dict[str, Any]:
    """One destination as ``view`` shows it (``ok`` and empty when Sluice knows nothing
    of it yet)."""
    now = now or utcnow()
    [found] = _described(services, [key], now, read_overrides(services.db, now))
    return found


__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "STATES", "Page", "busiest", "describe", "parse_page",
           "view"]
