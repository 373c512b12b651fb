"""The erasure registry against the live schema, on both backends.

If this fails after a migration: the new column holds a user reference. Add a
``Target`` (and its count_/purge_ queries) or an ``Exemption`` with the reason to
``shared/erasure/registry.py``.
"""

from __future__ import annotations

import pytest

from shared.erasure.registry import (
    EXEMPTIONS,
    TARGETS,
    looks_personal,
    schema_columns,
    stale,
    unregistered,
)
from shared.store.db import SQL_DIR, Queries


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
