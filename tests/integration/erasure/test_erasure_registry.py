"""The erasure registry against the live schema, on both backends.

If this fails after a migration: the new column holds a user reference. Add a
``Target`` (and its count_/purge_ queries) or an ``Exemption`` with the reason to
``shared/sluice/erasure/registry.py``.
"""

from __future__ import annotations

import pytest

from sluice.erasure.registry import (
    EXEMPTIONS,
    TARGETS,
    looks_personal,
    schema_columns,
    stale,
    subject_params,
    unregistered,
)
from sluice.store.db import SQL_DIR, Queries


def test_every_user_column_is_registered_for_erasure_or_exempted(db) -> None:  # type: ignore[no-untyped-def]
    columns = schema_columns(db)
    assert ("ai_usage_ledger", "user_id") in columns, "the inspection sees the real schema"
    assert unregistered(columns) == []
    assert stale(columns) == []


def test_a_new_table_with_a_user_column_fails_the_check(db) -> None:  # type: ignore[no-untyped-def]
    with db.transaction() as tx:
        tx.execute("CREATE TABLE user_notes (id text PRIMARY KEY, author_user_id text, "
                   "billing_customer_id text, contact_email text, body text, created_by text)")
    found = unregistered(schema_columns(db))
    assert found == [("user_notes", "author_user_id"), ("user_notes", "billing_customer_id"),
                     ("user_notes", "contact_email"), ("user_notes", "created_by")]


def test_a_registry_entry_for_a_dropped_table_is_reported(db) -> None:  # type: ignore[no-untyped-def]
    columns = [c for c in schema_columns(db) if c[0] != "admin_audit"]
    assert ("admin_audit", "actor") in stale(columns)


@pytest.mark.parametrize("column,personal", [
    ("user_id", True), ("subject_user_id", True), ("actor", True), ("external_customer_id", True),
    ("email", True), ("ip", True), ("requested_by", True), ("recipient_chat_id", True),
    ("id", False), ("ledger_id", False), ("tenant_id", False), ("key", False),
    ("status", False), ("usage_count", False), ("topic", False),
])
def test_which_column_names_count_as_user_references(column: str, personal: bool) -> None:
    assert looks_personal(column) is personal


def test_every_target_has_both_queries_for_both_dialects() -> None:
    queries = Queries.parse((SQL_DIR / "erasure.sql").read_text())
    for target in TARGETS:
        for query in (target.count, target.purge):
            assert getattr(queries, query.name) == query
            assert query.for_dialect("sqlite") and query.for_dialect("postgres")
    assert all(e.reason for e in EXEMPTIONS)
    assert len({t.name for t in TARGETS}) == len(TARGETS)


# One row per (table, column) a target claims: the subject appears in that column
# ONLY, so a purge query that does not look at the column misses it. A target column
# without a probe here fails the test: a claim must be proved.
S = "subj-9"
PROBES: dict[tuple[str, str], tuple[str, dict[str, object]]] = {
    ("ai_usage_metering_outbox", "external_customer_id"): (
        ("INSERT INTO ai_usage_metering_outbox (id, ledger_id, external_customer_id, event_name, "
        "metadata) VALUES ('o1', 'nope', :s, 'ai_usage', :m)"), {"m": "{}"}),
    ("ai_usage_ledger", "user_id"): (
        ("INSERT INTO ai_usage_ledger (id, tenant_id, user_id, model, occurred_at) "
        "VALUES ('l1', 'other', :s, 'm', :now)"), {}),
    ("delivery_queue", "subject_user_id"): (
        ("INSERT INTO delivery_queue (id, channel, recipient, subject_user_id, payload, "
        "next_attempt_at, enqueued_at) VALUES ('d1', 'slack', 'C-other', :s, :m, :now, :now)"),
        {"m": "{}"}),
    ("delivery_queue", "recipient"): (
        ("INSERT INTO delivery_queue (id, channel, recipient, payload, next_attempt_at, "
        "enqueued_at) VALUES ('d2', 'telegram', :s, :m, :now, :now)"), {"m": "{}"}),
    ("admin_audit", "actor"): (
        ("INSERT INTO admin_audit (id, actor, action, outcome, at) "
        "VALUES ('a1', :s, 'x', 'ok', :now)"), {}),
    ("admin_audit", "ip"): (
        ("INSERT INTO admin_audit (id, actor, action, outcome, ip, at) "
        "VALUES ('a2', :s, 'x', 'ok', '127.0.0.1', :now)"), {}),
    # A row an older purge pseudonymised but whose forwarded address it kept.
    ("admin_audit", "detail"): ((
        ("INSERT INTO data_erasure_requests (id, subject_user_id, status, requested_by, "
         "requested_at, grace_until) VALUES ('r9', :s, 'purged', 'dpo', :now, :now)"),
        ("INSERT INTO admin_audit (id, actor, action, outcome, at, detail) "
         "VALUES ('a3', 'erased:r9', 'x', 'ok', :now, :m)")),
        {"m": {"forwardedFor": "127.0.0.9"}}),
    ("data_erasure_requests", "requested_by"): (
        ("INSERT INTO data_erasure_requests (id, subject_user_id, status, requested_by, "
        "requested_at, grace_until) VALUES ('r1', 'other', 'cancelled', :s, :now, :now)"), {}),
    ("data_erasure_requests", "confirmed_by"): (
        ("INSERT INTO data_erasure_requests (id, subject_user_id, status, requested_by, "
        "confirmed_by, requested_at, grace_until) "
        "VALUES ('r2', 'other2', 'cancelled', 'dpo', :s, :now, :now)"), {}),
}


def test_every_claimed_column_is_proved_by_a_probe() -> None:
    claimed = {(t.table, c) for t in TARGETS for c in t.columns if c}
    assert claimed == set(PROBES), "each column a target claims needs a probe row here"


@pytest.mark.parametrize("key", sorted(PROBES), ids=lambda k: f"{k[0]}.{k[1]}")
def test_a_row_holding_the_subject_only_in_a_claimed_column_is_counted_and_purged(
        db, key: tuple[str, str]) -> None:  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    sql, extra = PROBES[key]
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    with db.transaction() as tx:
        for statement in sql if isinstance(sql, tuple) else (sql,):
            tx.execute(statement, {"s": S, "now": now,
                                   **{k: tx.json(v if isinstance(v, dict) else {})
                                      if k == "m" else v for k, v in extra.items()}})
    [target] = [t for t in TARGETS if t.table == key[0] and key[1] in t.columns]
    params = subject_params(S, pseudonym="erased:r")
    with db.transaction() as tx:
        assert tx.fetchone(target.count, params)["n"] == 1, f"{target.name} misses {key}"
        assert tx.execute(target.purge, params) == 1
        assert tx.fetchone(target.count, params)["n"] == 0
