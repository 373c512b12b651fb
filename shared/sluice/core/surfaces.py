"""Admin surfaces and the roles that grant them: one table, read by auth, jobs and routes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

Surface = Literal["ingestion", "state", "delivery", "queues", "metering", "ledger", "erasure",
                  "flags", "alerts", "audit"]

SURFACE_ROLES: Mapping[Surface, frozenset[str]] = {
    "ingestion": frozenset({"super_admin", "ops"}),
    "state": frozenset({"super_admin", "ops"}),
    "delivery": frozenset({"super_admin", "ops"}),
    "queues": frozenset({"super_admin", "ops"}),
    "metering": frozenset({"super_admin", "billing"}),
    "ledger": frozenset({"super_admin", "billing"}),
    "erasure": frozenset({"super_admin", "privacy"}),
    "flags": frozenset({"super_admin"}),
    "alerts": frozenset({"super_admin", "ops"}),
    # The trail names every actor and what they did, erasures included.
    "audit": frozenset({"super_admin", "ops"}),
}
