"""Delivery destinations for the operator: the view (``sluice.ops.destination_view``), and
flow control previewed then applied.

A change (``ACTIONS``: pause until a time, resume, disable, enable, override the rate per
second or per minute until a time, or clear that override) is parsed strictly from the
same body the API takes and the command line builds (``parse_change``: a field an action
does not take is a 400, times carry their offset and are bounded), ``preview`` answers
what it would do (the destination now, its entries that it moves) and ``apply`` does it.
What each change means for an entry is a row of the delivery policy; the transports write
one audit row a change, whose ``detail`` is ``Change.to_json()`` (who is the row's actor).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from sluice.core.errors import Conflict, RequestError
from sluice.core.times import iso_z, iso_z_or_none
from sluice.core.validate import check_text
from sluice.delivery.destinations import Destinations, check_key
from sluice.delivery.ratelimit import PERIODS_S, Per
from sluice.ops.audit import parse_time
from sluice.ops.destination_view import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    STATES,
    Page,
    busiest,
    describe,
    parse_page,
    view,
)
from sluice.store.db import utcnow

if TYPE_CHECKING:
    from sluice.core.services import Services

MAX_AHEAD = timedelta(days=30)  # the furthest a pause or an override may reach
MAX_REASON = 200
# The bounds of an override, per period (the settings' own bounds, per second and minute).
RATE_BOUNDS: dict[str, tuple[float, float]] = {"second": (0.01, 10_000.0),
                                               "minute": (0.1, 600_000.0)}


class Action(NamedTuple):
    name: str
    help: str
    fields: tuple[str, ...]  # what its body may hold
    required: tuple[str, ...] = ()


ACTIONS: dict[str, Action] = {a.name: a for a in (
    Action("pause", "its entries wait until a time: nothing sent, no attempt counted, "
                    "nothing expires", ("until", "reason"), ("until",)),
    Action("resume", "end its pause now: its entries are due at once", ()),
    Action("disable", "its pending entries fail destination_disabled, nothing sent, until "
                      "it is enabled", ("reason",)),
    Action("enable", "it starts afresh; redrive what its disable failed", ()),
    Action("rate", "override its rate until a time (limit per second or per minute), or "
                   "clear the override", ("limit", "per", "until", "clear")),
)}


class Change(NamedTuple):
    action: str
    destination: str
    until: datetime | None = None
    reason: str | None = None
    limit: float | None = None
    per: Per | None = None
    clear: bool = False

    def to_json(self) -> dict[str, Any]:
        """What the audit row's ``detail`` holds: what changes, and until when."""
        return {"action": self.action, "destination": self.destination,
                "until": iso_z_or_none(self.until), "reason": self.reason,
                "rate": None if self.limit is None else {"limit": self.limit, "per": self.per},
                "clear": self.clear}


def parse_change(action: str, destination: str, body: dict[str, Any], *,
                 now: datetime | None = None) -> Change:
    """``body`` (the API's JSON object; the command line builds the same) as a change of
    ``destination``: every field checked and bounded, a field the action does not take, or
    one it needs missing, a 400 naming it."""
    spec = ACTIONS.get(action)
    if spec is None:
        raise RequestError(f"action must be one of {', '.join(ACTIONS)}, got {action!r}",
                           field="action")
    key = check_key(destination)
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object", field="body")
    unknown = sorted(set(body) - set(spec.fields))
    if unknown:
        takes = ", ".join(spec.fields) or "nothing"
        raise RequestError(f"{action} takes {takes}; not {unknown[0]!r}", field=unknown[0])
    for name in spec.required:
        if body.get(name) is None:
            raise RequestError(f"{action} needs {name}", field=name)
    now = now or utcnow()
    reason = body.get("reason")
    if reason is not None:
        reason = check_text(reason, field="reason", limit=MAX_REASON)
    if action == "rate":
        return _rate(key, body, now)
    until = _until(body.get("until"), now) if "until" in spec.fields else None
    return Change(action, key, until=until, reason=reason)


def _until(raw: Any, now: datetime) -> datetime:
    if not isinstance(raw, str):
        raise RequestError("until must be an ISO 8601 time such as 2026-12-01T10:00:00Z",
                           field="until")
    until = parse_time("until", raw)
    assert until is not None
    if until <= now:
        raise RequestError(f"until must be later than now ({iso_z(now)})", field="until")
    if until - now > MAX_AHEAD:
        raise RequestError(f"until must be within {MAX_AHEAD.days} days", field="until")
    return until.astimezone(UTC)


def _rate(key: str, body: dict[str, Any], now: datetime) -> Change:
    if body.get("clear") is not None:
        if body["clear"] is not True or set(body) != {"clear"}:
            raise RequestError("clear is true, alone (it ends the override now)", field="clear")
        return Change("rate", key, clear=True)
    for name in ("limit", "per", "until"):
        if body.get(name) is None:
            raise RequestError(f"rate needs limit, per and until (or clear: true); {name} "
                               "is missing", field=name)
    per = body["per"]
    if per not in RATE_BOUNDS:
        raise RequestError(f"per must be second or minute, got {per!r}", field="per")
    limit = body["limit"]
    lo, hi = RATE_BOUNDS[per]
    # The bounds are compared first: Python compares an int of any length with a float
    # exactly, where converting it to a float overflows; NaN and the infinities fail
    # the comparison too.
    if (isinstance(limit, bool) or not isinstance(limit, int | float)
            or not lo <= limit <= hi):
        raise RequestError(f"limit must be a number from {lo:g} to {hi:g} (per {per})",
                           field="limit")
    return Change("rate", key, until=_until(body["until"], now), limit=float(limit), per=per)


# --- a change: preview, apply ---------------------------------------------------------


def _destinations(services: Services) -> Destinations:
    return Destinations(services.db, services.settings.delivery_outage_threshold)


def _effect(change: Change, current: dict[str, Any], entries: dict[str, int]) -> str:
    """What ``change`` does, in words (the console shows it before the confirm)."""
    key, pending, flying = change.destination, entries["pending"], entries["inFlight"]
    later = f"; {flying} in flight settle as their sends end" if flying else ""
    if change.action == "pause":
        return (f"{pending} pending entries for {key} wait until {iso_z_or_none(change.until)}:"
                f" nothing sent, no attempt counted, none expires{later}; then they are due "
                "at once")
    if change.action == "resume":
        return f"{pending} pending entries for {key} are due at once{later}"
    if change.action == "disable":
        return (f"{pending} pending entries for {key} fail destination_disabled now, nothing "
                f"sent, and so does every later one until it is enabled{later}")
    if change.action == "enable":
        return (f"{key} starts afresh; its {entries['failedDisabled']} entries failed "
                "destination_disabled stay failed until redriven (sluice delivery redrive "
                f"--all-failed --destination {key})")
    if change.clear:
        return f"the rate override of {key} ends now; the settings' rates apply"
    before = "; ".join(f"{r['limit']:g}/{r['per']} ({r['source']})" for r in current["rates"])
    return (f"{key} is sent to at most {change.limit:g} a {change.per} until "
            f"{iso_z_or_none(change.until)}, then at its settings' rate again (now: "
            f"{before or 'none'})")


def _check(change: Change, current: dict[str, Any]) -> None:
    """A change that would do nothing is refused (409), not silently accepted."""
    key, state = change.destination, current["state"]
    if change.action == "resume" and current["paused"] is None:
        raise Conflict(f"{key} is not paused", destination=key, state=state)
    if change.action == "enable" and current["disabled"] is None:
        raise Conflict(f"{key} is not disabled", destination=key, state=state)
    if change.action == "disable" and current["disabled"] is not None:
        raise Conflict(f"{key} is disabled already (since {current['disabled']['since']}: "
                       f"{current['disabled']['reason']})", destination=key, state=state)
    if change.action == "pause" and current["disabled"] is not None:
        raise Conflict(f"{key} is disabled: enable it before pausing it", destination=key,
                       state=state)
    if change.action == "rate" and change.clear and current["rateOverride"] is None:
        raise Conflict(f"{key} has no rate override", destination=key, state=state)


def preview(services: Services, change: Change, *, now: datetime | None = None
            ) -> dict[str, Any]:
    """What ``change`` would do, changing nothing: the destination now, the entries it
    moves, and the effect in words (409 if it would do nothing)."""
    now = now or utcnow()
    current = describe(services, change.destination, now=now)
    _check(change, current)
    entries = _destinations(services).entries(change.destination)
    return {"destination": change.destination, "change": change.to_json(), "dryRun": True,
            "current": current, "entries": entries,
            "effect": _effect(change, current, entries)}


def apply(services: Services, change: Change, *, now: datetime | None = None
          ) -> dict[str, Any]:
    """Do ``change``: the preview's answer, with ``moved`` (the entries it moved) and the
    destination after it as ``current``."""
    now = now or utcnow()
    answer = preview(services, change, now=now)
    destinations, key = _destinations(services), change.destination
    moved = 0
    if change.action == "pause":
        assert change.until is not None
        moved = destinations.pause(key, change.until, now=now)
    elif change.action == "resume":
        moved = destinations.resume(key, now=now)
    elif change.action == "disable":
        moved = destinations.disable(key, f"by an operator: {change.reason or 'no reason given'}",
                                     now=now)
    elif change.action == "enable":
        destinations.enable(key, now=now)
    elif change.clear:
        destinations.clear_rate(key, now=now)
    else:
        assert change.limit is not None and change.per is not None and change.until is not None
        destinations.override_rate(key, change.limit, PERIODS_S[change.per], change.until,
                                   now=now)
    return {**answer, "dryRun": False, "moved": moved,
            "current": describe(services, key, now=now)}


# the view, for the transports that read it beside the changes
__all__ = ["ACTIONS", "DEFAULT_LIMIT", "MAX_LIMIT", "STATES", "Action", "Change", "Page",
           "apply", "busiest", "describe", "parse_change", "parse_page", "preview", "view"]
