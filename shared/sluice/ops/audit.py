"""The audit trail, read: who did what to what, and when, newest first.

Only actions are in it (a confirmation page or a dry run writes nothing, see
``sluice.http.app.preview``). One query serves the API (``GET /api/admin/audit``), the
console page (``/admin/audit``) and ``sluice audit``: filters by actor, action, target
(a prefix: ``/api/admin/erasure`` matches every erasure request) and a time window.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from sluice.core.errors import RequestError
from sluice.core.times import iso_z
from sluice.core.validate import check_instant
from sluice.store.db import Database, load_queries

Q = load_queries("runs")
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


class AuditFilter(NamedTuple):
    actor: str | None = None
    action: str | None = None
    target: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = DEFAULT_LIMIT

    def to_json(self) -> dict[str, Any]:
        return {"actor": self.actor, "action": self.action, "target": self.target,
                "since": iso_z(self.since) if self.since else None,
                "until": iso_z(self.until) if self.until else None, "limit": self.limit}


def parse_time(name: str, raw: str | None) -> datetime | None:
    """An ISO 8601 instant with its offset (``2026-12-01T10:00:00Z``; ``check_instant``)."""
    if raw is None or raw == "":
        return None
    # a query string's unencoded "+" of an offset arrives as a space
    return check_instant(raw.replace(" ", "+"), field=name)


def parse_filter(values: dict[str, str]) -> AuditFilter:
    """The filter from query parameters or options (names as in the API)."""
    raw_limit = values.get("limit") or str(DEFAULT_LIMIT)
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise RequestError(f"limit must be a whole number from 1 to {MAX_LIMIT}", field="limit")
    since, until = parse_time("since", values.get("since")), parse_time("until", values.get("until"))
    if since and until and until <= since:
        raise RequestError("until must be later than since", field="until")
    return AuditFilter(actor=values.get("actor") or None, action=values.get("action") or None,
                       target=values.get("target") or None, since=since, until=until,
                       limit=int(raw_limit))


def find(db: Database, flt: AuditFilter) -> dict[str, Any]:
    with db.transaction() as tx:
        rows = tx.fetchall(Q.find_audit, dict(flt._asdict()))
    entries = [{"id": r["id"], "at": iso_z(r["at"]), "actor": r["actor"], "action": r["action"],
                "target": r["target"], "outcome": r["outcome"], "ip": r["ip"],
                "detail": r["detail"]} for r in rows]
    return {"filter": flt.to_json(), "count": len(entries), "entries": entries}
