"""The one registry of where a user's personal data lives, and how erasure treats it.

Every table column that can hold a user reference is either a ``Target`` here
(erased by deleting the row or pseudonymising the column) or an ``Exemption``
with its reason. ``unregistered()`` compares this registry with the live schema;
a test runs it on both engines, so a table added later with a ``user_id`` (or
``actor``, ``*_customer_id``, ``email``, ``*_by``, …) column fails the suite
until someone decides what erasure does with it.

Data outside the SQL store (Redis lists today; topic DLQs and the delivery queue
once they exist) are ``ExternalStore``s: swept after the purge commits, counted
by the same verification.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from sluice.store.db import Database, Query, Tx, load_queries
from sluice.store.state import like_escape

if TYPE_CHECKING:
    from sluice.store.redis_clients import RedisClient

Q = load_queries("erasure")


class How(StrEnum):
    DELETE = "delete"
    PSEUDONYMISE = "pseudonymise"


@dataclass(frozen=True)
class Target:
    """One place in the SQL store holding the subject; ``name`` keys the per-table counts."""

    name: str
    table: str
    columns: tuple[str, ...]  # the user columns it covers ("" for a key convention)
    how: How
    count: Query
    purge: Query
    note: str


class Exemption(NamedTuple):
    table: str
    column: str
    reason: str


# Order matters: the outbox follows ledger_id, so it is purged before the ledger.
TARGETS: tuple[Target, ...] = (
    Target("ai_usage_metering_outbox", "ai_usage_metering_outbox", ("external_customer_id",),
           How.DELETE, Q.count_outbox, Q.purge_outbox,
           "rows whose ledger row belongs to the subject, and rows billed to the subject "
           "directly (external_customer_id = subject id)"),
    Target("ai_usage_ledger", "ai_usage_ledger", ("user_id",), How.DELETE,
           Q.count_ledger, Q.purge_ledger, "every ledger row of the subject, in any tenant"),
    Target("platform_state", "platform_state", ("",), How.DELETE, Q.count_state, Q.purge_state,
           "keys with a 'user:<id>' segment pair: user:<id>, user:<id>:…, …:user:<id>:…, "
           "…:user:<id>"),
    Target("platform_state_hash", "platform_state_hash", ("",), How.DELETE,
           Q.count_state_hash, Q.purge_state_hash, "same key convention as platform_state"),
    Target("alert_rules", "platform_state", ("",), How.DELETE, Q.count_alert_rules,
           Q.purge_alert_rules,
           "alert rules ('platform:alerts-rules:<scope>' rows) whose destination recipient is "
           "the subject id (any case): the rule is removed from its scope's list, the "
           "scope's other rules stay"),
    Target("delivery_queue", "delivery_queue", ("subject_user_id", "recipient"), How.DELETE,
           Q.count_delivery, Q.purge_delivery,
           "outbound messages for the subject, whatever their status: rows naming the "
           "subject in subject_user_id, and rows whose recipient is the subject id itself "
           "(slack: a user id; telegram: a chat id; email: the address, any case; webhook: "
           "a URL, never a user id). A recipient that is not the subject id (an address of "
           "a user known by another id) is found only through subject_user_id"),
    Target("admin_audit.actor", "admin_audit", ("actor", "ip", "detail"), How.PSEUDONYMISE,
           Q.count_audit_actor, Q.purge_audit_actor,
           "the trail is kept; actor becomes erased:<request id>, ip and the forwarded "
           "address (detail.forwardedFor) are cleared, also on rows an earlier purge "
           "pseudonymised"),
    Target("data_erasure_requests.requested_by", "data_erasure_requests", ("requested_by",),
           How.PSEUDONYMISE, Q.count_requested_by, Q.purge_requested_by,
           "an operator who is themselves erased becomes erased:<request id>"),
    Target("data_erasure_requests.confirmed_by", "data_erasure_requests", ("confirmed_by",),
           How.PSEUDONYMISE, Q.count_confirmed_by, Q.purge_confirmed_by,
           "as requested_by"),
)

EXEMPTIONS: tuple[Exemption, ...] = (
    Exemption("erasure_tombstones", "subject_user_id",
              "the tombstone that keeps erased data from being written again (ledger-redrive "
              "and record_usage drop entries of a tombstoned user): an opaque id, as in "
              "data_erasure_requests.subject_user_id"),
    Exemption("data_erasure_requests", "subject_user_id",
              "the record that the erasure happened (GDPR art. 5(2) accountability): an opaque "
              "id, no other personal data, and the pseudonyms above resolve through it"),
    Exemption("delivery_effects", "subject",
              "what an effect record is about: an alert's story id (a public article), "
              "never a person"),
    Exemption("delivery_queue", "held_by",
              "the destination an entry waits on: a webhook host and port or a channel "
              "name, never a recipient"),
    # Foundation tables without a user column, listed so the decision is written down
    # (column "" means the whole table).
    Exemption("job_runs", "", "job names, triggers, request ids and drain results holding "
              "counts and ids, never a user reference"),
    Exemption("job_leases", "", "one row per job: the holder is a request id, not a user"),
    Exemption("schema_migrations", "", "migration bookkeeping"),
    Exemption("queue_completed_keys", "", "idempotency keys of rss.* messages: topics, batch "
              "ids and feed ids, never a user"),
    Exemption("queue_dead_letters", "", "in-process dead letters of the rss.* topics, whose "
              "messages name feeds, not users (the SQS -dlq topics likewise)"),
    Exemption("rss_sources", "", "publishers' feed URLs, titles and fetch state; no user"),
    Exemption("rss_scopes", "", "a tenant's source set and locale: tenant ids are "
              "organisations, never a person"),
    Exemption("rss_stories", "", "public articles as published by the feed"),
    Exemption("rss_builds", "", "catalog builds: the stories above, per source set"),
    Exemption("rss_build_locks", "", "build leases: a key and a random token"),
)

# Column-name tokens that mark a user reference; "*_by" columns name an actor too.
PERSONAL_TOKENS = frozenset({
    "user", "users", "subject", "actor", "customer", "email", "phone", "recipient", "ip",
    "chat",
})


def looks_personal(column: str) -> bool:
    tokens = column.lower().split("_")
    return bool(PERSONAL_TOKENS.intersection(tokens)) or column.lower().endswith("_by")


def registered_columns() -> dict[tuple[str, str], str]:
    """(table, column) -> what covers it: a target's name or ``exempt: <reason>``."""
    covered = {(t.table, c): t.name for t in TARGETS for c in t.columns if c}
    covered.update({(e.table, e.column): f"exempt: {e.reason}" for e in EXEMPTIONS if e.column})
    return covered


def schema_columns(db: Database) -> list[tuple[str, str]]:
    """Every (table, column) of the live schema (information_schema / PRAGMA)."""
    with db.transaction() as tx:
        rows = tx.fetchall(Q.schema_columns)
    return [(row["table"], row["column"]) for row in rows]


def present_targets(tx: Tx) -> list[Target]:
    """The targets whose table exists (a feature's table may not be migrated yet)."""
    tables = {row["table"] for row in tx.fetchall(Q.schema_tables)}
    return [t for t in TARGETS if t.table in tables]


def unregistered(columns: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Columns that look like user references but are neither targets nor exemptions."""
    covered = registered_columns()
    return [(t, c) for t, c in columns if looks_personal(c) and (t, c) not in covered]


def stale(columns: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Registry entries naming a column (or table) the schema does not have."""
    present = set(columns)
    tables = {t for t, _ in present}
    entries = [(t.table, c) for t in TARGETS for c in t.columns]
    entries += [(e.table, e.column) for e in EXEMPTIONS]
    return [(t, c) for t, c in entries if (t not in tables if not c else (t, c) not in present)]


def subject_params(subject: str, pseudonym: str) -> dict[str, str]:
    """Parameters shared by every count_/purge_ query (see shared/sluice/store/sql/erasure.sql)."""
    segment = f"user:{subject}"
    escaped = like_escape(segment)
    return {
        "subject": subject, "pseudonym": pseudonym, "s_exact": segment,
        "p_prefix": f"{escaped}:%", "p_infix": f"%:{escaped}:%", "p_suffix": f"%:{escaped}",
    }


def state_key(subject: str, *parts: str) -> str:
    """A platform_state key scoped to ``subject`` by the convention above."""
    return ":".join(("user", subject, *parts))


# --- Stores outside the transaction -------------------------------------------------


class ExternalStore(Protocol):
    """Personal data outside the SQL store, swept idempotently after the purge commits."""

    @property
    def name(self) -> str: ...

    def count(self, redis: RedisClient | None, subject: str) -> dict[str, int]: ...

    def purge(self, redis: RedisClient | None, subject: str) -> dict[str, int]: ...


# Counts (ARGV[2] == "0") or removes (ARGV[2] == "1") the entries of each list in
# KEYS whose owner is ARGV[1]: entry.userId or userId, a number read as its digits, also
# inside a dead letter that kept a non-object envelope as raw text ({"raw": "..."}).
# An entry whose owner cannot be read but whose text holds ARGV[1] is unmatchable: it is
# counted apart and left in place for an operator, never taken as clean. One script, so
# the lists are read in one atomic step: an LMOVE between them cannot hide an entry.
_LIST_SWEEP = """
local function owner_of(doc)
  if type(doc) ~= 'table' then return nil end
  local owner = doc.userId
  if type(doc.entry) == 'table' then owner = doc.entry.userId end
  if type(owner) == 'number' and owner == math.floor(owner) then
    owner = string.format('%.0f', owner)
  end
  if type(owner) == 'string' then return owner end
  return nil
end
local counts = {}
for i, key in ipairs(KEYS) do
  local n, unmatched = 0, 0
  for _, raw in ipairs(redis.call('LRANGE', key, 0, -1)) do
    local owner = nil
    local ok, doc = pcall(cjson.decode, raw)
    if ok then
      owner = owner_of(doc)
      if owner == nil and type(doc) == 'table' and type(doc.raw) == 'string' then
        local inner_ok, inner = pcall(cjson.decode, doc.raw)
        if inner_ok then owner = owner_of(inner) end
      end
    end
    if owner == ARGV[1] then
      n = n + 1
      if ARGV[2] == '1' then redis.call('LREM', key, 0, raw) end
    elseif owner == nil and string.find(raw, ARGV[1], 1, true) then
      unmatched = unmatched + 1
    end
  end
  counts[2 * i - 1] = n
  counts[2 * i] = unmatched
end
return counts
"""


@dataclass(frozen=True)
class RedisJsonLists:
    """Redis lists of JSON entries naming their user in ``entry.userId`` (or ``userId``);
    entries that may hold the subject but name no owner are reported as
    ``redis:<list>:unmatchable``."""

    name: str
    lists: tuple[str, ...]

    def _sweep(self, redis: RedisClient | None, subject: str, remove: bool) -> dict[str, int]:
        if redis is None:  # no Redis configured: no list can hold anything
            return {}
        counts: list[Any] = redis.eval(_LIST_SWEEP, list(self.lists), [subject, "1" if remove
                                                                       else "0"])
        result: dict[str, int] = {}
        for index, key in enumerate(self.lists):
            result[f"redis:{key}"] = int(counts[2 * index])
            if int(counts[2 * index + 1]):
                result[f"redis:{key}:unmatchable"] = int(counts[2 * index + 1])
        return result

    def count(self, redis: RedisClient | None, subject: str) -> dict[str, int]:
        return self._sweep(redis, subject, remove=False)

    def purge(self, redis: RedisClient | None, subject: str) -> dict[str, int]:
        return self._sweep(redis, subject, remove=True)


LEDGER_RETRY_LISTS = ("ai:ledger:retry:queue", "ai:ledger:retry:processing",
                      "ai:ledger:retry:dlq")

# Extension point: a store outside the database that holds a subject joins this tuple
# (a RedisJsonLists for Redis-held lists, or a store of its own).
EXTERNAL_STORES: tuple[ExternalStore, ...] = (
    RedisJsonLists("ledger-retry", LEDGER_RETRY_LISTS),
)
