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

-- Subjects erased before tombstones existed get theirs; a purge never verified is swept again.
INSERT INTO erasure_tombstones (subject_user_id, request_id, erased_at, sweep_pending)
SELECT subject_user_id, id, purged_at, verified_at IS NULL FROM data_erasure_requests
WHERE status IN ('purged', 'failed') AND purged_at IS NOT NULL
ORDER BY purged_at DESC
ON CONFLICT (subject_user_id) DO NOTHING;
