"""Lambda event shapes. The path an event takes is decided by its shape alone."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

SCHEDULE_SOURCES = frozenset({"aws.events", "aws.scheduler"})

EventKind = Literal["schedule", "sqs", "http", "unknown"]


class ScheduledEvent(TypedDict, total=False):
    version: str
    id: str
    source: str
    account: str
    time: str
    region: str
    resources: list[str]
    detail: dict[str, Any]


def kind_of(event: Any) -> EventKind:
    if not isinstance(event, dict):
        return "unknown"
    if event.get("source") in SCHEDULE_SOURCES and event.get("detail-type") == "Scheduled Event":
        return "schedule"
    records = event.get("Records")
    if isinstance(records, list) and records and all(
        isinstance(r, dict) and r.get("eventSource") == "aws:sqs" for r in records
    ):
        return "sqs"
    if "requestContext" in event and ("rawPath" in event or "path" in event):
        return "http"
    return "unknown"
