-- Foundation: the key-value state store, job runs, leases and the admin audit trail.
-- Timestamps are UTC text in one fixed format (see shared/sluice/store/db.py), so they sort.

CREATE TABLE IF NOT EXISTS platform_state (
    key text PRIMARY KEY,
    value jsonb NOT NULL,
    expires_at timestamptz NULL,
    updated_at timestamptz NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f000+00:00', 'now'))
);
CREATE INDEX IF NOT EXISTS platform_state_expires_idx
    ON platform_state (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE IF NOT EXISTS platform_state_hash (
    key text NOT NULL,
    field text NOT NULL,
    value jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f000+00:00', 'now')),
    PRIMARY KEY (key, field)
);
CREATE INDEX IF NOT EXISTS platform_state_hash_updated_idx
    ON platform_state_hash (key, updated_at);

CREATE TABLE IF NOT EXISTS job_runs (
    id text PRIMARY KEY,
    job text NOT NULL,
    trigger text NOT NULL CHECK (trigger IN ('schedule', 'cron_http', 'admin', 'cli')),
    request_id text NULL,
    started_at timestamptz NOT NULL,
    finished_at timestamptz NULL,
    duration_ms integer NULL,
    outcome text NOT NULL CHECK (outcome IN ('running', 'ok', 'failures', 'error', 'skipped')),
    result jsonb NULL
);
CREATE INDEX IF NOT EXISTS job_runs_job_started_idx ON job_runs (job, started_at DESC);

CREATE TABLE IF NOT EXISTS job_leases (
    job text PRIMARY KEY,
    holder text NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE TABLE IF NOT EXISTS admin_audit (
    id text PRIMARY KEY,
    actor text NOT NULL,
    action text NOT NULL,
    target text NULL,
    outcome text NOT NULL,
    ip text NULL,
    at timestamptz NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f000+00:00', 'now')),
    detail jsonb NULL
);
CREATE INDEX IF NOT EXISTS admin_audit_at_idx ON admin_audit (at DESC);
CREATE INDEX IF NOT EXISTS admin_audit_actor_idx ON admin_audit (actor);
