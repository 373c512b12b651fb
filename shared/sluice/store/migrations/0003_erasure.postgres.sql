-- GDPR erasure: one row per request, from `requested` through a grace window to
-- `purged` (or `cancelled` / `failed`). The row itself is the record that the
-- erasure happened (see shared/sluice/erasure/registry.py for why it is kept).

CREATE TABLE IF NOT EXISTS data_erasure_requests (
    id text PRIMARY KEY,
    subject_user_id text NOT NULL,
    tenant_id text NULL,
    status text NOT NULL DEFAULT 'requested'
        CHECK (status IN ('requested', 'cancelled', 'purged', 'failed')),
    requested_by text NOT NULL,
    requested_at timestamptz NOT NULL,
    grace_until timestamptz NOT NULL,
    confirmed_by text NULL,
    purged_at timestamptz NULL,
    verified_at timestamptz NULL,
    result jsonb NULL,
    last_error text NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- At most one open request per subject: a second create returns the open one.
CREATE UNIQUE INDEX IF NOT EXISTS data_erasure_requests_open_idx
    ON data_erasure_requests (subject_user_id) WHERE status = 'requested';
-- Serves listDueDataErasureRequests.
CREATE INDEX IF NOT EXISTS data_erasure_requests_due_idx
    ON data_erasure_requests (grace_until, id) WHERE status = 'requested';
-- Purges committed but not yet verified (a crash between commit and the Redis sweep).
CREATE INDEX IF NOT EXISTS data_erasure_requests_unverified_idx
    ON data_erasure_requests (purged_at) WHERE status = 'purged' AND verified_at IS NULL;
CREATE INDEX IF NOT EXISTS data_erasure_requests_requested_at_idx
    ON data_erasure_requests (requested_at DESC);
