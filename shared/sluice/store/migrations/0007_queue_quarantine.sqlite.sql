-- Push queues: messages the consumer rejected (malformed, forged, misrouted, or signed
-- with a secret it does not hold), kept as received for the DLQ tooling.

CREATE TABLE IF NOT EXISTS queue_quarantine (
    id text PRIMARY KEY,
    topic text NOT NULL,
    message_id text NULL,
    reason text NOT NULL,
    body text NOT NULL,
    received_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS queue_quarantine_received_idx ON queue_quarantine (received_at DESC);
