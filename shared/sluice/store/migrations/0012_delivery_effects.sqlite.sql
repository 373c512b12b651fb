-- Effects that must happen once for the life of the data, and the delivery states that
-- keep them bounded (shared/sluice/delivery/store.py, shared/sluice/delivery/effects.py).
--
-- delivery_effects: one row per idempotency key a producer derived from data it reads
-- again (an alert match: scope, rule, story). Written in the enqueue's transaction and
-- never deleted by the delivery retention, so a pruned, failed, expired or purged entry
-- is never enqueued again; its producer prunes it once the data that could trigger it
-- again is gone (see docs/alerts.md for the bound). outcome is informational: the last
-- state its entry was seen in (enqueued while the entry lives; the entry's final state
-- when it is pruned; purged when an operator purged it).
CREATE TABLE IF NOT EXISTS delivery_effects (
    idempotency_key text PRIMARY KEY,
    producer text NOT NULL,
    scope_id text NULL,
    subject text NULL,
    entry_id text NULL,
    outcome text NOT NULL DEFAULT 'enqueued'
        CHECK (outcome IN ('enqueued', 'acked', 'failed', 'unknown', 'purged')),
    recorded_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS delivery_effects_producer_idx
    ON delivery_effects (producer, updated_at);
-- Alert matches already on the queue get their record now (keys 'alert:<sha256>').
INSERT INTO delivery_effects
    (idempotency_key, producer, entry_id, outcome, recorded_at, updated_at)
SELECT idempotency_key, 'alert', id,
       CASE WHEN status IN ('acked', 'failed') THEN status ELSE 'enqueued' END,
       enqueued_at, updated_at
FROM delivery_queue WHERE idempotency_key LIKE 'alert:%'
ON CONFLICT (idempotency_key) DO NOTHING;

-- A send whose outcome is unknown (sent, no answer) is its own state once it may not be
-- sent again: 'unknown', until an operator marks it delivered, sends it again or purges it.
-- unknown_sends counts the sends that ended that way; held_by names the destination an
-- entry waits on while that destination is down (no attempt counted). SQLite cannot
-- change a CHECK constraint in place: the table is rebuilt with the same rows.
CREATE TABLE delivery_queue_0012 (
    id text PRIMARY KEY,
    channel text NOT NULL,
    recipient text NOT NULL,
    subject_user_id text NULL,
    payload jsonb NOT NULL,
    idempotency_key text NULL,
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'in_flight', 'acked', 'failed', 'unknown')),
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    lease_until timestamptz NULL,
    last_error text NULL,
    platform_message_id text NULL,
    duration_ms integer NULL,
    enqueued_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f000+00:00', 'now')),
    acked_at timestamptz NULL,
    failed_at timestamptz NULL,
    failure_reason text NULL,
    unknown_sends integer NOT NULL DEFAULT 0,
    held_by text NULL
);
INSERT INTO delivery_queue_0012
    (id, channel, recipient, subject_user_id, payload, idempotency_key, status, attempts,
     next_attempt_at, lease_until, last_error, platform_message_id, duration_ms, enqueued_at,
     updated_at, acked_at, failed_at, failure_reason)
SELECT id, channel, recipient, subject_user_id, payload, idempotency_key, status, attempts,
       next_attempt_at, lease_until, last_error, platform_message_id, duration_ms, enqueued_at,
       updated_at, acked_at, failed_at, failure_reason
FROM delivery_queue;
DROP TABLE delivery_queue;
ALTER TABLE delivery_queue_0012 RENAME TO delivery_queue;
CREATE UNIQUE INDEX IF NOT EXISTS delivery_queue_idempotency_idx
    ON delivery_queue (idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS delivery_queue_active_idx
    ON delivery_queue (status, next_attempt_at) WHERE status IN ('pending', 'in_flight');
CREATE INDEX IF NOT EXISTS delivery_queue_settled_idx
    ON delivery_queue (status, updated_at) WHERE status IN ('acked', 'failed');
CREATE INDEX IF NOT EXISTS delivery_queue_subject_idx
    ON delivery_queue (subject_user_id) WHERE subject_user_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS delivery_queue_held_idx
    ON delivery_queue (held_by) WHERE held_by IS NOT NULL;

-- A destination (a webhook host, a chat API, an SMTP server) that fails transiently: its
-- entries wait without counting attempts, and one of them probes it per backoff step.
CREATE TABLE IF NOT EXISTS delivery_destinations (
    key text PRIMARY KEY,
    down_since timestamptz NOT NULL,
    failures integer NOT NULL,
    last_error text NULL,
    next_probe_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
