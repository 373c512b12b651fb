-- Operations history: small samples the console draws as charts. A `depth` sample
-- is one queue's depth when the console was read; a `job` sample is one job run's
-- outcome and duration. state-cleanup prunes samples older than the retention.

CREATE TABLE IF NOT EXISTS ops_samples (
    id text PRIMARY KEY,
    kind text NOT NULL CHECK (kind IN ('depth', 'job')),
    name text NOT NULL,
    at timestamptz NOT NULL,
    value double precision NULL,
    outcome text NULL
);
CREATE INDEX IF NOT EXISTS ops_samples_kind_name_at_idx ON ops_samples (kind, name, at);
CREATE INDEX IF NOT EXISTS ops_samples_at_idx ON ops_samples (at);
