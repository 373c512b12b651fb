"""Give exhausted metering outbox rows their attempts back (``sluice billing reset-attempts``).

A row is exhausted at ``MAX_METERING_ATTEMPTS``. Earlier versions counted an attempt
for every send, so an outage (Polar down, a wrong token, a rate limit, Postgres lost
mid-run) could exhaust rows Polar never judged. Such a row's ``last_error`` says so:
``outage_error`` recognises it. By default only those rows are reset; a row Polar
refused for good (another 4xx) is reset only when named by id or with
``include_refused``, after its cause is fixed. Re-sending is safe: Polar deduplicates
on ``external_id``.

The selection, the reset and its ``admin_audit`` row are one transaction.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection
from typing import Any, NamedTuple

from sluice.billing.metering import IN_FLIGHT_NOTE
from sluice.billing.polar import AUTH_STATUSES, TRANSIENT_STATUSES
from sluice.billing.usage import MAX_METERING_ATTEMPTS
from sluice.store.db import Database, load_queries, utcnow

Q = load_queries("usage")
RUNS = load_queries("runs")

ACTION = "billing:reset-attempts"
_STATUS = re.compile(r"^polar (\d{3})\b")
MAX_LISTED = 100


def outage_error(last_error: str | None) -> bool:
    """Whether a row's last error means Polar never judged it (an outage, not the row)."""
    if not last_error or last_error == IN_FLIGHT_NOTE or last_error.startswith("network: "):
        return True
    match = _STATUS.match(last_error)
    if match is None:
        return False
    status = int(match.group(1))
    return status >= 500 or status in TRANSIENT_STATUSES or status in AUTH_STATUSES


class ResetResult(NamedTuple):
    dry_run: bool
    reset: list[str]  # ids reset (or that would be)
    kept: list[str]  # exhausted rows left alone: refused by Polar, not named

    def to_json(self) -> dict[str, Any]:
        return {"dryRun": self.dry_run, "reset": len(self.reset), "kept": len(self.kept),
                "ids": self.reset[:MAX_LISTED], "keptIds": self.kept[:MAX_LISTED]}


def reset_attempts(db: Database, *, actor: str, ids: Collection[str] = (),
                   include_refused: bool = False, dry_run: bool = False) -> ResetResult:
    """Reset exhausted rows to ``pending`` with no attempts; audited unless ``dry_run``."""
    wanted = set(ids)
    with db.transaction() as tx:
        rows = tx.fetchall(Q.exhausted_outbox, {"max_attempts": MAX_METERING_ATTEMPTS})
        if wanted:
            chosen = [r for r in rows if r["id"] in wanted]
        else:
            chosen = [r for r in rows if include_refused or outage_error(r["last_error"])]
        chosen_ids = {r["id"] for r in chosen}
        kept = [r["id"] for r in rows if r["id"] not in chosen_ids]
        result = ResetResult(dry_run, [r["id"] for r in chosen], kept)
        if dry_run or not chosen:
            return result
        tx.executemany(Q.reset_outbox_attempts, [
            {"id": r["id"], "max_attempts": MAX_METERING_ATTEMPTS,
             "note": f"attempts reset by {actor}; before: {(r['last_error'] or '')[:1800]}"}
            for r in chosen])
        tx.execute(RUNS.audit, {
            "id": str(uuid.uuid4()), "actor": actor, "action": ACTION,
            "target": "ai_usage_metering_outbox", "outcome": "reset", "ip": None,
            "at": utcnow(), "detail": tx.json({
                "reset": len(chosen), "ids": result.reset[:MAX_LISTED],
                "named": sorted(wanted)[:MAX_LISTED], "includeRefused": include_refused}),
        })
    return result
