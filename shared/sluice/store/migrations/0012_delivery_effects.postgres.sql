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
-- entry waits on while that destination is down (no attempt counted).
ALTER TABLE delivery_queue DROP CONSTRAINT IF EXISTS delivery_queue_status_check;
ALTER TABLE delivery_queue ADD CONSTRAINT delivery_queue_status_check
    CHECK (status IN ('pending', 'in_flight', 'acked', 'failed', 'unknown'));
ALTER TABLE delivery_queue ADD COLUMN unknown_sends integer NOT NULL DEFAULT 0;
ALTER TABLE delivery_queue ADD COLUMN held_by text NULL;
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
