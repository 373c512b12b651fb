"""GDPR erasure requests: create (with a grace window), list, show, cancel.

A request is ``requested`` until its grace window ends; then erasure-purge (or an
operator's confirm) purges the subject and marks it ``purged``, or ``failed``
when verification finds data left behind. ``cancelled`` is final. The purge
itself lives in ``sluice.erasure.purge``.
"""

from __future__ import annotations

import builtins
import uuid
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple

from sluice.core.errors import Conflict, ConstraintViolation, NotFound, RequestError
from sluice.core.times import iso_z_or_none
from sluice.core.validate import check_identifier
from sluice.store.db import Database, Row, load_queries, utcnow

Q = load_queries("erasure")

MAX_GRACE_DAYS = 365
MAX_SUBJECT_LENGTH = 256
MAX_LIST = 500


class ErasureStatus(StrEnum):
    REQUESTED = "requested"
    CANCELLED = "cancelled"
    PURGED = "purged"
    FAILED = "failed"


iso = iso_z_or_none


class ErasureRequest(NamedTuple):
    id: str
    subject_user_id: str
    tenant_id: str | None
    status: ErasureStatus
    requested_by: str
    requested_at: datetime
    grace_until: datetime
    confirmed_by: str | None
    purged_at: datetime | None
    verified_at: datetime | None
    result: dict[str, Any] | None
    last_error: str | None
    purge_attempts: int = 0  # runs whose purge of it raised (sluice.erasure.purge)

    @classmethod
    def from_row(cls, row: Row) -> ErasureRequest:
        return cls(
            id=row["id"], subject_user_id=row["subject_user_id"], tenant_id=row["tenant_id"],
            status=ErasureStatus(row["status"]), requested_by=row["requested_by"],
            requested_at=row["requested_at"], grace_until=row["grace_until"],
            confirmed_by=row["confirmed_by"], purged_at=row["purged_at"],
            verified_at=row["verified_at"], result=row["result"], last_error=row["last_error"],
            purge_attempts=int(row.get("purge_attempts") or 0),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "subjectUserId": self.subject_user_id, "tenantId": self.tenant_id,
            "status": self.status.value, "requestedBy": self.requested_by,
            "requestedAt": iso(self.requested_at), "graceUntil": iso(self.grace_until),
            "confirmedBy": self.confirmed_by, "purgedAt": iso(self.purged_at),
            "verifiedAt": iso(self.verified_at), "result": self.result,
            "lastError": self.last_error, "purgeAttempts": self.purge_attempts,
        }


# --- Input checks (RequestError: a typed 400 on the API, exit 2 on the CLI) -----------


def check_subject(value: Any, field: str = "subjectUserId") -> str:
    return check_identifier(value, field=field, limit=MAX_SUBJECT_LENGTH)


def check_optional_id(value: Any, field: str) -> str | None:
    return None if value is None else check_subject(value, field)


def check_grace_days(value: Any, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise RequestError(f"graceDays must be a whole number of days between 0 and "
                               f"{MAX_GRACE_DAYS}, got {value!r}", field="graceDays")
    if not 0 <= value <= MAX_GRACE_DAYS:
        raise RequestError(f"graceDays must be between 0 and {MAX_GRACE_DAYS}, got {value}",
                           field="graceDays")
    return int(value)


def check_status(value: str | None) -> ErasureStatus | None:
    if value is None or value == "":
        return None
    try:
        return ErasureStatus(value)
    except ValueError:
        raise RequestError(f"status must be one of {', '.join(s.value for s in ErasureStatus)}, "
                           f"got {value!r}") from None


# --- The store --------------------------------------------------------------------------


class ErasureStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create(self, subject: str, *, requested_by: str, grace_days: int,
               tenant_id: str | None = None, now: datetime | None = None,
               ) -> tuple[ErasureRequest, bool]:
        """A new ``requested`` request, or the subject's open one (``created`` False)."""
        now = now or utcnow()
        request_id = str(uuid.uuid4())
        try:
            with self.db.transaction() as tx:
                row = tx.fetchone(Q.open_request_for_subject, {"subject": subject})
                if row is None:
                    tx.execute(Q.insert_request, {
                        "id": request_id, "subject_user_id": subject, "tenant_id": tenant_id,
                        "requested_by": requested_by, "requested_at": now,
                        "grace_until": now + timedelta(days=grace_days),
                    })
                    row = tx.fetchone(Q.get_request, {"id": request_id})
        except ConstraintViolation:
            # A concurrent create won the unique "one open request per subject" index.
            with self.db.transaction() as tx:
                row = tx.fetchone(Q.open_request_for_subject, {"subject": subject})
            if row is None:
                raise
        assert row is not None
        request = ErasureRequest.from_row(row)
        return request, request.id == request_id

    def get(self, request_id: str) -> ErasureRequest:
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.get_request, {"id": request_id})
        if row is None:
            raise NotFound(f"no erasure request {request_id!r}", id=request_id)
        return ErasureRequest.from_row(row)

    def list(self, *, status: ErasureStatus | None = None, subject: str | None = None,
             limit: int = 100) -> list[ErasureRequest]:
        if not 1 <= limit <= MAX_LIST:
            raise RequestError(f"limit must be between 1 and {MAX_LIST}, got {limit}")
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.list_requests, {
                "status": status.value if status else None, "subject": subject, "limit": limit})
        return [ErasureRequest.from_row(row) for row in rows]

    def cancel(self, request_id: str, *, now: datetime | None = None) -> ErasureRequest:
        with self.db.transaction() as tx:
            changed = tx.execute(Q.cancel_request, {"id": request_id, "now": now or utcnow()})
            row = tx.fetchone(Q.get_request, {"id": request_id})
        if row is None:
            raise NotFound(f"no erasure request {request_id!r}", id=request_id)
        request = ErasureRequest.from_row(row)
        if not changed:
            raise Conflict(f"erasure request {request_id} is {request.status.value}; only a "
                           "requested one can be cancelled", id=request_id,
                           status=request.status.value)
        return request

    def due(self, now: datetime, limit: int = 100) -> builtins.list[ErasureRequest]:
        """listDueDataErasureRequests: ``requested`` and past the grace window."""
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.list_due, {"now": now, "limit": limit})
        return [ErasureRequest.from_row(row) for row in rows]

    def count_due(self, now: datetime | None = None) -> int:
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.count_due, {"now": now or utcnow()})
        return int(row["n"]) if row else 0

    def summary(self, now: datetime | None = None) -> dict[str, Any]:
        """For the operations surface: due requests and counts by status."""
        now = now or utcnow()
        with self.db.transaction() as tx:
            due = tx.fetchone(Q.count_due, {"now": now})
            rows = tx.fetchall(Q.count_by_status)
        by_status = {status.value: 0 for status in ErasureStatus}
        by_status.update({row["status"]: int(row["n"]) for row in rows})
        return {"due": int(due["n"]) if due else 0, "byStatus": by_status}

    def sweep_pending(self, limit: int = 100) -> builtins.list[ErasureRequest]:
        """Purges whose sweep outside the transaction has not succeeded yet."""
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.list_sweep_pending, {"limit": limit})
        return [ErasureRequest.from_row(row) for row in rows]

    def tombstone(self, subject: str) -> Row | None:
        with self.db.transaction() as tx:
            return tx.fetchone(Q.tombstone_for, {"subject": subject})
