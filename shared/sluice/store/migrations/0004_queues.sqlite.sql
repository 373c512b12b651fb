-- Push queues: idempotency keys of messages whose handler completed (kept for the
-- queue's retention), and the dead letters of the in-process (not provisioned) mode.

CREATE TABLE IF NOT EXISTS queue_completed_keys (
    key text PRIMARY KEY,
    topic text NOT NULL,
    message_id text NULL,
    completed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS queue_completed_keys_expires_idx ON queue_completed_keys (expires_at);

CREATE TABLE IF NOT EXISTS queue_dead_letters (
    id text PRIMARY KEY,
    topic text NOT NULL,
    summary jsonb NOT NULL,
    failed_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS queue_dead_letters_topic_idx ON queue_dead_letters (topic, failed_at DESC);
