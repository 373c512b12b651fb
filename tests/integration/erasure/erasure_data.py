"""Test data for erasure: one subject spread over every registered store, plus decoys."""

from __future__ import annotations

import json
from typing import Any

from sluice.core.services import Services
from sluice.erasure.registry import LEDGER_RETRY_LISTS
from sluice.jobs.runs import RunStore
from sluice.store.db import Database, utcnow

# Keys that belong to the subject by the platform_state convention, and keys that must
# survive: another user whose id starts the same, a different case, a lookalike segment.
SUBJECT_KEYS = ("user:{s}", "user:{s}:prefs", "tenant:t1:user:{s}:quota", "alerts:user:{s}")
DECOY_KEYS = ("user:{s}0", "user:{s}0:prefs", "tenant:t1:user:{S}:quota", "usr:{s}",
              "xuser:{s}", "user:other:{s}x", "tenant:user:{s}_")


def seed_subject(db: Database, subject: str, *, rows: int = 3, tenant: str = "t1") -> None:
    """``rows`` ledger rows with outbox rows, a directly billed outbox row, state, audit."""
    now = utcnow()
    with db.transaction() as tx:
        tx.executemany(
            "INSERT INTO ai_usage_ledger (id, tenant_id, user_id, model, occurred_at) "
            "VALUES (:id, :tenant, :user, 'gpt', :now)",
            [{"id": f"{subject}-l{i}", "tenant": tenant, "user": subject, "now": now}
             for i in range(rows)])
        tx.executemany(
            "INSERT INTO ai_usage_metering_outbox (id, ledger_id, external_customer_id, "
            "event_name) VALUES (:id, :ledger, :customer, 'ai_usage')",
            [{"id": f"{subject}-o{i}", "ledger": f"{subject}-l{i}", "customer": tenant}
             for i in range(rows)]
            + [{"id": f"{subject}-direct", "ledger": "none", "customer": subject}])
        for template in SUBJECT_KEYS + DECOY_KEYS:
            key = template.format(s=subject, S=subject.upper())
            tx.execute("INSERT INTO platform_state (key, value, updated_at) "
                       "VALUES (:key, :value, :now)", {"key": key, "value": tx.json({"k": key}),
                                                       "now": now})
            tx.execute("INSERT INTO platform_state_hash (key, field, value, updated_at) "
                       "VALUES (:key, 'f', :value, :now)",
                       {"key": key, "value": tx.json(1), "now": now})
    if has_table(db, "delivery_queue"):
        with db.transaction() as tx:
            tx.executemany(
                "INSERT INTO delivery_queue (id, channel, recipient, subject_user_id, payload, "
                "next_attempt_at, enqueued_at) VALUES (:id, 'email', :to, :user, :p, :now, :now)",
                [{"id": f"{subject}-d{i}", "to": f"{subject}@example.com", "user": user,
                  "p": tx.json({"text": "hi"}), "now": now}
                 for i, user in enumerate((subject, subject, f"{subject}0", None))])
    runs = RunStore(db)
    runs.audit(actor=subject, action="erasure:create", target="/x", outcome="201",
               ip="10.0.0.1", detail={"requestId": "r", "forwardedFor": "10.0.0.1, 10.0.0.3"})
    runs.audit(actor=f"{subject}0", action="erasure:create", target="/x", outcome="201",
               ip="10.0.0.2")


def seed_redis(services: Services, subject: str, *, per_list: int = 2) -> None:
    redis = services.redis
    for name in LEDGER_RETRY_LISTS:
        for i in range(per_list):
            for user in (subject, f"{subject}0"):
                entry = {"id": f"r-{name}-{user}-{i}", "attempts": 1, "enqueuedAt": 1,
                         "lastError": None,
                         "entry": {"id": f"r-{user}-{i}", "tenantId": "t1", "userId": user}}
                redis.rpush(name, json.dumps(entry))
        redis.rpush(name, "not json")


def count(db: Database, sql: str, params: dict[str, Any] | None = None) -> int:
    with db.transaction() as tx:
        row = tx.fetchone(sql, params or {})
    return int(row["n"]) if row else -1


def redis_entries(services: Services) -> dict[str, list[str]]:
    return {name: services.redis.lrange(name, 0, -1) for name in LEDGER_RETRY_LISTS}


def has_table(db: Database, table: str) -> bool:
    from sluice.erasure.registry import Q

    with db.transaction() as tx:
        return table in {row["table"] for row in tx.fetchall(Q.schema_tables)}


def delivery_rows(db: Database) -> dict[str, int]:
    """The delivery_queue share of the expected per-table counts (once the table exists)."""
    return {"delivery_queue": 2} if has_table(db, "delivery_queue") else {}
