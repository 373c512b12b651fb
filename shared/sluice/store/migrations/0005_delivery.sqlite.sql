-- The write-ahead delivery queue: an outbound message (alert, notice) is written
-- here as `pending` before it is sent, then settled `acked` or `failed`; a
-- transient error puts it back to `pending` with a later next_attempt_at. A
-- sender holds an entry `in_flight` under a lease; a lapsed lease returns it to
-- `pending` (see shared/sluice/delivery/store.py). subject_user_id is the app user the
-- message is for (optional), so an erasure can find their entries.

CREATE TABLE IF NOT EXISTS delivery_queue (
    id text PRIMARY KEY,
    channel text NOT NULL,
    recipient text NOT NULL,
    subject_user_id text NULL,
    payload jsonb NOT NULL,
    idempotency_key text NULL,
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'in_flight', 'acked', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    lease_until timestamptz NULL,
    last_error text NULL,
    platform_message_id text NULL,
    duration_ms integer NULL,
    enqueued_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f000+00:00', 'now')),
    acked_at timestamptz NULL,
    failed_at timestamptz NULL
);
-- A caller-supplied key makes enqueue idempotent (a second enqueue returns the first).
CREATE UNIQUE INDEX IF NOT EXISTS delivery_queue_idempotency_idx
    ON delivery_queue (idempotency_key) WHERE idempotency_key IS NOT NULL;
-- Active entries only: claim (pending, due) and lease recovery (in_flight, lapsed).
CREATE INDEX IF NOT EXISTS delivery_queue_active_idx
    ON delivery_queue (status, next_attempt_at) WHERE status IN ('pending', 'in_flight');
-- Admin listing of failed entries and pruning of settled ones.
CREATE INDEX IF NOT EXISTS delivery_queue_settled_idx
    ON delivery_queue (status, updated_at) WHERE status IN ('acked', 'failed');
CREATE INDEX IF NOT EXISTS delivery_queue_subject_idx
    ON delivery_queue (subject_user_id) WHERE subject_user_id IS NOT NULL;
