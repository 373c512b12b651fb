-- One row per erased subject, written in the purge's transaction. Every producer of
-- ledger rows (record_usage, ledger-redrive) drops an entry of a subject found here,
-- so a copy that waited in Redis during the purge never brings the data back.
-- sweep_pending marks a purge whose sweep of the stores outside the transaction
-- (Redis) has not succeeded yet: erasure-purge retries it on every run until it does.

CREATE TABLE IF NOT EXISTS erasure_tombstones (
    subject_user_id text PRIMARY KEY,
    request_id text NOT NULL,
    erased_at timestamptz NOT NULL,
    sweep_pending boolean NOT NULL DEFAULT true
);
CREATE INDEX IF NOT EXISTS erasure_tombstones_sweep_idx
    ON erasure_tombstones (erased_at) WHERE sweep_pending;
