"""erasure-purge: one subject with 10,000 rows over the registered tables, purged by Sluice's
set-based transaction versus the same deletes issued one statement per row, same run.

Both sides run on a scratch Postgres database and on a SQLite file, through the same
``Database`` seam, with the same data reloaded before every timed run: the subject's
rows (ledger 4,000, outbox 3,000, platform_state 1,500, its hash 1,000, audit 500,
i.e. SLUICE_BENCH_ERASURE_ROWS split in those shares) among 20,000 rows of other users.
Sluice's time includes what the baseline skips: locking the request, marking it and
the verification counts. The baseline is given the row ids for free (selected before
its clock starts), which favours it.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.common import Row, row, scratch_database
from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.erasure.purge import purge_request
from sluice.erasure.requests import ErasureStore
from sluice.store.db import Params, PostgresDatabase, SqliteDatabase, utcnow
from sluice.store.migrate import migrate

ROWS = int(os.environ.get("SLUICE_BENCH_ERASURE_ROWS", "10000"))
REPEAT = int(os.environ.get("SLUICE_BENCH_ERASURE_REPEAT", "3"))
OTHERS = 20_000
SHARES = {"ledger": 0.40, "outbox": 0.30, "state": 0.15, "hash": 0.10, "audit": 0.05}
SUBJECT = "bench-subject"
Database = SqliteDatabase | PostgresDatabase


def _sizes(total: int) -> dict[str, int]:
    sizes = {name: int(total * share) for name, share in SHARES.items()}
    sizes["ledger"] += total - sum(sizes.values())
    return sizes


def _load(db: Database, total: int) -> None:
    sizes = _sizes(total)
    now = utcnow()
    with db.transaction() as tx:
        for table in ("ai_usage_metering_outbox", "ai_usage_ledger", "platform_state",
                      "platform_state_hash", "admin_audit", "data_erasure_requests"):
            tx.execute(f"DELETE FROM {table}")
        users = [(SUBJECT, sizes)] + [(f"other-{i}", _sizes(OTHERS // 100)) for i in range(100)]
        ledger: list[Params] = []
        outbox: list[Params] = []
        state: list[Params] = []
        hashes: list[Params] = []
        audit: list[Params] = []
        for user, size in users:
            ledger += [{"id": f"{user}-l{i}", "u": user, "now": now} for i in range(size["ledger"])]
            outbox += [{"id": f"{user}-o{i}", "l": f"{user}-l{i}"} for i in range(size["outbox"])]
            state += [{"k": f"tenant:t1:user:{user}:k{i}", "v": tx.json(i), "now": now}
                      for i in range(size["state"])]
            hashes += [{"k": f"user:{user}:h", "f": f"f{i}", "v": tx.json(i), "now": now}
                       for i in range(size["hash"])]
            audit += [{"id": f"{user}-a{i}", "u": user, "now": now} for i in range(size["audit"])]
        tx.executemany("INSERT INTO ai_usage_ledger (id, tenant_id, user_id, model, occurred_at) "
                       "VALUES (:id, 't1', :u, 'm', :now)", ledger)
        tx.executemany("INSERT INTO ai_usage_metering_outbox (id, ledger_id, "
                       "external_customer_id, event_name) VALUES (:id, :l, 't1', 'ai')", outbox)
        tx.executemany("INSERT INTO platform_state (key, value, updated_at) "
                       "VALUES (:k, :v, :now)", state)
        tx.executemany("INSERT INTO platform_state_hash (key, field, value, updated_at) "
                       "VALUES (:k, :f, :v, :now)", hashes)
        tx.executemany("INSERT INTO admin_audit (id, actor, action, outcome, at) "
                       "VALUES (:id, :u, 'x', '200', :now)", audit)
    if isinstance(db, PostgresDatabase):
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")


def _sluice(services: Services) -> float:
    request, _ = ErasureStore(services.db).create(SUBJECT, requested_by="bench", grace_days=0)
    started = time.perf_counter()
    outcome = purge_request(services, request.id, confirmed_by="bench")
    elapsed = time.perf_counter() - started
    assert outcome is not None and outcome.status == "purged", outcome
    assert sum(outcome.tables.values()) == ROWS, outcome.tables
    return elapsed


def _per_row(db: Database) -> float:
    with db.transaction() as tx:
        ids: dict[str, list[dict[str, Any]]] = {
            "outbox": tx.fetchall("SELECT o.id FROM ai_usage_metering_outbox o JOIN "
                                  "ai_usage_ledger l ON l.id = o.ledger_id WHERE l.user_id = :s",
                                  {"s": SUBJECT}),
            "ledger": tx.fetchall("SELECT id FROM ai_usage_ledger WHERE user_id = :s",
                                  {"s": SUBJECT}),
            "state": tx.fetchall("SELECT key FROM platform_state WHERE key LIKE :p",
                                 {"p": f"%:user:{SUBJECT}:%"}),
            "hash": tx.fetchall("SELECT key, field FROM platform_state_hash WHERE key = :k",
                                {"k": f"user:{SUBJECT}:h"}),
            "audit": tx.fetchall("SELECT id FROM admin_audit WHERE actor = :s", {"s": SUBJECT}),
        }
    assert sum(len(v) for v in ids.values()) == ROWS
    started = time.perf_counter()
    with db.transaction() as tx:
        for r in ids["outbox"]:
            tx.execute("DELETE FROM ai_usage_metering_outbox WHERE id = :id", r)
        for r in ids["ledger"]:
            tx.execute("DELETE FROM ai_usage_ledger WHERE id = :id", r)
        for r in ids["state"]:
            tx.execute("DELETE FROM platform_state WHERE key = :key", r)
        for r in ids["hash"]:
            tx.execute("DELETE FROM platform_state_hash WHERE key = :key AND field = :field", r)
        for r in ids["audit"]:
            tx.execute("UPDATE admin_audit SET actor = 'erased:x', ip = NULL WHERE id = :id", r)
    return time.perf_counter() - started


def _measure(db: Database, label: str) -> Row:
    services = Services(Settings(database_url="sqlite:///unused"), db, Reporter())
    sluice, baseline = [], []
    for _ in range(REPEAT):
        _load(db, ROWS)
        sluice.append(_sluice(services))
        _load(db, ROWS)
        baseline.append(_per_row(db))
    return row(f"erasure: purge {ROWS:,} rows of one subject ({label})",
               statistics.median(sluice), statistics.median(baseline), "s",
               higher_is_better=False,
               note=f"one statement per table vs one per row; {OTHERS:,} other users' rows; "
                    f"median of {REPEAT}")


def run() -> list[Row]:
    rows: list[Row] = []
    with scratch_database() as pg:
        rows.append(_measure(pg, "Postgres"))
    with tempfile.TemporaryDirectory() as scratch:
        lite = SqliteDatabase(str(Path(scratch) / "bench.db"))
        migrate(lite)
        rows.append(_measure(lite, "SQLite"))
    return rows
