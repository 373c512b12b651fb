-- The AI usage ledger and its metering outbox (public contract: see docs/billing.md).
-- Batches travel as one JSON array parameter (:rows / :ids), so 100 rows cost one statement.
-- created_at is the writer's :now, never the database's clock: the outbox is sent oldest
-- first, and its age is judged against the application's clock.

-- name: write_usage
-- Postgres only (a SQLite statement inserts into one table: there write_entries runs
-- erased_subjects, insert_ledger_rows and insert_outbox_rows). write_entries in one
-- statement: the run's fence (as in claim_outbox; nothing is written when the lease is
-- not held), the erasure tombstones (an entry whose user was erased is dropped, an
-- outbox row whose customer was erased is not written), the ledger rows (ids already
-- there are skipped) and the outbox rows of those inserted now, built here as
-- usage.metering_row builds them: billable when there is a customer (the tenant, else
-- the user) and some usage; id = ledger id + :id_suffix. Returns lease_held, the ids
-- inserted now and the ids erased.
WITH lease AS (
    SELECT 1 FROM job_leases
    WHERE job = :fence_job AND holder = :fence_holder AND expires_at > :fence_now
    FOR SHARE
), fence AS (
    SELECT (:fence_job::text IS NULL OR EXISTS (SELECT 1 FROM lease)) AS held
), batch AS (
    SELECT r.* FROM jsonb_to_recordset(:rows) AS r(
        id text, tenant_id text, user_id text, model text, input_tokens integer,
        output_tokens integer, cost_micros bigint, occurred_at timestamptz)
    WHERE (SELECT held FROM fence)
), gone AS (
    SELECT t.subject_user_id AS subject FROM erasure_tombstones t
    WHERE t.subject_user_id IN (SELECT user_id FROM batch UNION SELECT tenant_id FROM batch)
), ledger AS (
    INSERT INTO ai_usage_ledger
        (id, tenant_id, user_id, model, input_tokens, output_tokens, cost_micros, occurred_at,
         created_at)
    SELECT b.id, b.tenant_id, b.user_id, b.model, b.input_tokens, b.output_tokens,
           b.cost_micros, b.occurred_at, :now
    FROM batch b
    WHERE NOT EXISTS (SELECT 1 FROM gone WHERE gone.subject = b.user_id)
    ON CONFLICT (id) DO NOTHING
    RETURNING id, coalesce(nullif(tenant_id, ''), nullif(user_id, '')) AS customer, model,
              input_tokens, output_tokens, cost_micros
), outbox AS (
    INSERT INTO ai_usage_metering_outbox
        (id, ledger_id, external_customer_id, event_name, metadata, created_at)
    SELECT l.id || :id_suffix, l.id, l.customer, :event_name,
           jsonb_build_object('model', l.model, 'input_tokens', l.input_tokens,
                              'output_tokens', l.output_tokens,
                              'total_tokens', l.input_tokens + l.output_tokens,
                              'cost_micros', l.cost_micros, 'ledger_id', l.id),
           :now
    FROM ledger l
    WHERE l.customer IS NOT NULL
      AND (l.input_tokens <> 0 OR l.output_tokens <> 0 OR l.cost_micros <> 0)
      AND NOT EXISTS (SELECT 1 FROM gone WHERE gone.subject = l.customer)
    ON CONFLICT (id) DO NOTHING
)
SELECT f.held AS lease_held, ARRAY(SELECT id FROM ledger) AS inserted,
       ARRAY(SELECT b.id FROM batch b JOIN gone ON gone.subject = b.user_id) AS erased
FROM fence f

-- name: insert_ledger_rows @postgres
INSERT INTO ai_usage_ledger
    (id, tenant_id, user_id, model, input_tokens, output_tokens, cost_micros, occurred_at,
     created_at)
SELECT r.id, r.tenant_id, r.user_id, r.model, r.input_tokens, r.output_tokens, r.cost_micros,
       r.occurred_at, :now
FROM jsonb_to_recordset(:rows) AS r(id text, tenant_id text, user_id text, model text,
                                     input_tokens integer, output_tokens integer,
                                     cost_micros bigint, occurred_at timestamptz)
ON CONFLICT (id) DO NOTHING
RETURNING id

-- name: insert_ledger_rows @sqlite
INSERT INTO ai_usage_ledger
    (id, tenant_id, user_id, model, input_tokens, output_tokens, cost_micros, occurred_at,
     created_at)
SELECT json_extract(value, '$.id'), json_extract(value, '$.tenant_id'),
       json_extract(value, '$.user_id'), json_extract(value, '$.model'),
       json_extract(value, '$.input_tokens'), json_extract(value, '$.output_tokens'),
       json_extract(value, '$.cost_micros'), json_extract(value, '$.occurred_at'), :now
FROM json_each(:rows) WHERE true
ON CONFLICT (id) DO NOTHING
RETURNING id

-- name: insert_outbox_rows @postgres
INSERT INTO ai_usage_metering_outbox
    (id, ledger_id, external_customer_id, event_name, metadata, created_at)
SELECT r.id, r.ledger_id, r.external_customer_id, r.event_name, r.metadata, :now
FROM jsonb_to_recordset(:rows) AS r(id text, ledger_id text, external_customer_id text,
                                     event_name text, metadata jsonb)
ON CONFLICT (id) DO NOTHING

-- name: insert_outbox_rows @sqlite
INSERT INTO ai_usage_metering_outbox
    (id, ledger_id, external_customer_id, event_name, metadata, created_at)
SELECT json_extract(value, '$.id'), json_extract(value, '$.ledger_id'),
       json_extract(value, '$.external_customer_id'), json_extract(value, '$.event_name'),
       json_extract(value, '$.metadata'), :now
FROM json_each(:rows) WHERE true
ON CONFLICT (id) DO NOTHING

-- name: claim_outbox @postgres
-- Claims up to :limit eligible rows, oldest first, in one statement with the run's fence:
-- rows are claimed only while the run holds its lease (the lease check is runs.sql's
-- lease_is_mine, share lock included, so a takeover waits until this commits; a NULL
-- :fence_job is no fence). The attempt is counted at the claim, and the row is left
-- 'failed' with an in-flight note: a process that dies while the row is in flight still
-- uses up one attempt; the mark after the send gives it back when Polar did not judge
-- the row. :tried holds the ids this run already sent (a failed row waits for the next
-- run). SKIP LOCKED keeps a concurrent claimer (there should be none: the job is
-- single-flight) off these rows. No row back: nothing eligible, or no lease.
UPDATE ai_usage_metering_outbox o
SET attempt_count = o.attempt_count + 1, status = 'failed', last_error = :note
WHERE o.id IN (
    SELECT p.id FROM ai_usage_metering_outbox p
    WHERE (p.status = 'pending' OR (p.status = 'failed' AND p.attempt_count < :max_attempts))
      AND p.id NOT IN (SELECT jsonb_array_elements_text(:tried))
      AND (:fence_job::text IS NULL OR EXISTS (
          SELECT 1 FROM job_leases
          WHERE job = :fence_job AND holder = :fence_holder AND expires_at > :fence_now
          FOR SHARE))
    ORDER BY p.created_at, p.id
    LIMIT :limit
    FOR UPDATE OF p SKIP LOCKED)
RETURNING o.id, o.ledger_id, o.external_customer_id, o.event_name, o.metadata,
          o.attempt_count, o.created_at,
          (SELECT l.occurred_at FROM ai_usage_ledger l WHERE l.id = o.ledger_id) AS occurred_at

-- name: claim_outbox @sqlite
-- The fence was checked by its own statement (Fence.bind) in this transaction.
UPDATE ai_usage_metering_outbox
SET attempt_count = attempt_count + 1, status = 'failed', last_error = :note
WHERE id IN (
    SELECT id FROM ai_usage_metering_outbox
    WHERE (status = 'pending' OR (status = 'failed' AND attempt_count < :max_attempts))
      AND id NOT IN (SELECT value FROM json_each(:tried))
    ORDER BY created_at, id
    LIMIT :limit)
RETURNING id, ledger_id, external_customer_id, event_name, metadata, attempt_count,
          created_at,
          (SELECT l.occurred_at FROM ai_usage_ledger l
           WHERE l.id = ai_usage_metering_outbox.ledger_id) AS occurred_at

-- name: claim_one_outbox
-- Postgres only (on SQLite claim_outbox serves every request: SQLite prepares a
-- statement once per connection and keeps it). claim_outbox for the usual request (one
-- row, nothing tried yet in this run), written so that Postgres keeps one generic plan
-- for it: the oldest eligible row by ``=`` on a LIMIT 1 sub-select, as a hand-written
-- claim would be. The general statement's
-- parameter LIMIT, ``IN`` and :tried anti-join make Postgres plan it afresh each time,
-- which cost a quarter of a row's database time.
UPDATE ai_usage_metering_outbox o
SET attempt_count = o.attempt_count + 1, status = 'failed', last_error = :note
WHERE o.id = (
    SELECT p.id FROM ai_usage_metering_outbox p
    WHERE (p.status = 'pending' OR (p.status = 'failed' AND p.attempt_count < :max_attempts))
      AND (:fence_job::text IS NULL OR EXISTS (
          SELECT 1 FROM job_leases
          WHERE job = :fence_job AND holder = :fence_holder AND expires_at > :fence_now
          FOR SHARE))
    ORDER BY p.created_at, p.id
    LIMIT 1
    FOR UPDATE OF p SKIP LOCKED)
RETURNING o.id, o.ledger_id, o.external_customer_id, o.event_name, o.metadata,
          o.attempt_count, o.created_at,
          (SELECT l.occurred_at FROM ai_usage_ledger l WHERE l.id = o.ledger_id) AS occurred_at

-- name: mark_and_claim_one_outbox
-- Postgres only (on SQLite the mark and claim_outbox run as two statements of one
-- transaction). mark_outbox_processed for the row just sent, and claim_one_outbox for the
-- next, as one statement: one commit and one round trip a row, no pipeline. Both parts
-- read one snapshot, where the row being marked still looks eligible: the claim leaves it
-- out by its id. The mark runs whether or not a row is claimed; when none is, the caller
-- tells a lost lease (nothing changed) from an empty outbox with a check of its own.
WITH fence AS (
    SELECT :fence_job::text IS NULL OR EXISTS (
        SELECT 1 FROM job_leases
        WHERE job = :fence_job AND holder = :fence_holder AND expires_at > :fence_now
        FOR SHARE) AS held
), marked AS (
    UPDATE ai_usage_metering_outbox
    SET status = 'processed', processed_at = :now, last_error = NULL
    WHERE id = :id AND (SELECT held FROM fence)
)
UPDATE ai_usage_metering_outbox o
SET attempt_count = o.attempt_count + 1, status = 'failed', last_error = :note
WHERE o.id = (
    SELECT p.id FROM ai_usage_metering_outbox p
    WHERE (p.status = 'pending' OR (p.status = 'failed' AND p.attempt_count < :max_attempts))
      AND p.id <> :id
      AND (SELECT held FROM fence)
    ORDER BY p.created_at, p.id
    LIMIT 1
    FOR UPDATE OF p SKIP LOCKED)
RETURNING o.id, o.ledger_id, o.external_customer_id, o.event_name, o.metadata,
          o.attempt_count, o.created_at,
          (SELECT l.occurred_at FROM ai_usage_ledger l WHERE l.id = o.ledger_id) AS occurred_at

-- name: count_eligible_outbox @postgres
SELECT count(*) AS n FROM ai_usage_metering_outbox
WHERE (status = 'pending' OR (status = 'failed' AND attempt_count < :max_attempts))
  AND id NOT IN (SELECT jsonb_array_elements_text(:tried))

-- name: count_eligible_outbox @sqlite
SELECT count(*) AS n FROM ai_usage_metering_outbox
WHERE (status = 'pending' OR (status = 'failed' AND attempt_count < :max_attempts))
  AND id NOT IN (SELECT value FROM json_each(:tried))

-- name: mark_outbox_processed @postgres
-- settle_outbox's usual case, one row Polar accepted, by its primary key (fenced likewise).
UPDATE ai_usage_metering_outbox
SET status = 'processed', processed_at = :now, last_error = NULL
WHERE id = :id
  AND (:fence_job::text IS NULL OR EXISTS (
      SELECT 1 FROM job_leases
      WHERE job = :fence_job AND holder = :fence_holder AND expires_at > :fence_now
      FOR SHARE))
RETURNING id

-- name: mark_outbox_processed @sqlite
-- The fence was checked by its own statement (Fence.bind) in this transaction.
UPDATE ai_usage_metering_outbox
SET status = 'processed', processed_at = :now, last_error = NULL
WHERE id = :id
RETURNING id

-- name: settle_outbox @postgres
-- Settles the rows of one send in one statement with the run's fence (as in
-- claim_outbox: nothing changes without the lease). :rows is a JSON object
-- id -> {op, error, charge}: op 'processed'; op 'failed' with charge 'exhaust' (every
-- attempt used up), 'count' (the attempt counted at the claim stands) or 'refund' (given
-- back); op 'refund': the attempt of a row settled earlier in the run, given back (it
-- was part of an outage). The rows are found by their ids through the primary key.
UPDATE ai_usage_metering_outbox o
SET status = CASE :rows -> o.id ->> 'op' WHEN 'refund' THEN o.status
                                         ELSE :rows -> o.id ->> 'op' END,
    processed_at = CASE :rows -> o.id ->> 'op' WHEN 'processed' THEN :now
                                               ELSE o.processed_at END,
    last_error = CASE :rows -> o.id ->> 'op' WHEN 'processed' THEN NULL
                                             WHEN 'failed' THEN :rows -> o.id ->> 'error'
                                             ELSE o.last_error END,
    attempt_count = CASE WHEN :rows -> o.id ->> 'op' = 'failed'
                              AND :rows -> o.id ->> 'charge' = 'exhaust' THEN :max_attempts
                         WHEN (:rows -> o.id ->> 'op' = 'refund'
                               OR :rows -> o.id ->> 'charge' = 'refund')
                              AND o.attempt_count > 0 THEN o.attempt_count - 1
                         ELSE o.attempt_count END
WHERE o.id = ANY (ARRAY(SELECT jsonb_object_keys(:rows)))
  AND (:rows -> o.id ->> 'op' <> 'refund' OR o.status = 'failed')
  AND (:fence_job::text IS NULL OR EXISTS (
      SELECT 1 FROM job_leases
      WHERE job = :fence_job AND holder = :fence_holder AND expires_at > :fence_now
      FOR SHARE))
RETURNING o.id

-- name: settle_outbox @sqlite
-- The fence was checked by its own statement (Fence.bind) in this transaction.
UPDATE ai_usage_metering_outbox AS o
SET status = CASE s.op WHEN 'refund' THEN o.status ELSE s.op END,
    processed_at = CASE s.op WHEN 'processed' THEN :now ELSE o.processed_at END,
    last_error = CASE s.op WHEN 'processed' THEN NULL
                           WHEN 'failed' THEN s.error ELSE o.last_error END,
    attempt_count = CASE WHEN s.op = 'failed' AND s.charge = 'exhaust' THEN :max_attempts
                         WHEN (s.op = 'refund' OR s.charge = 'refund')
                              AND o.attempt_count > 0 THEN o.attempt_count - 1
                         ELSE o.attempt_count END
FROM (SELECT key AS id, json_extract(value, '$.op') AS op,
             json_extract(value, '$.error') AS error, json_extract(value, '$.charge') AS charge
      FROM json_each(:rows)) AS s
WHERE o.id = s.id AND (s.op <> 'refund' OR o.status = 'failed')
RETURNING id

-- name: exhausted_outbox
-- Rows out of attempts, oldest first, for `sluice billing reset-attempts`.
SELECT id, ledger_id, external_customer_id, attempt_count, last_error, created_at
FROM ai_usage_metering_outbox
WHERE status = 'failed' AND attempt_count >= :max_attempts
ORDER BY created_at, id

-- name: reset_outbox_attempts
UPDATE ai_usage_metering_outbox
SET status = 'pending', attempt_count = 0, last_error = :note
WHERE id = :id AND status = 'failed' AND attempt_count >= :max_attempts

-- name: outbox_by_ledger
SELECT id, ledger_id, external_customer_id, event_name, metadata, status, attempt_count,
       last_error, created_at, processed_at
FROM ai_usage_metering_outbox WHERE ledger_id = :ledger_id

-- name: outbox_figures
-- For the operations page: what waits, what failed for good, and the oldest waiting row.
SELECT
    coalesce(sum(CASE WHEN status = 'pending' THEN 1 ELSE 0 END), 0) AS pending,
    coalesce(sum(CASE WHEN status = 'processed' THEN 1 ELSE 0 END), 0) AS processed,
    coalesce(sum(CASE WHEN status = 'failed' AND attempt_count < :max_attempts
                      THEN 1 ELSE 0 END), 0) AS retrying,
    coalesce(sum(CASE WHEN status = 'failed' AND attempt_count >= :max_attempts
                      THEN 1 ELSE 0 END), 0) AS exhausted,
    min(CASE WHEN status = 'pending' OR (status = 'failed' AND attempt_count < :max_attempts)
             THEN created_at END) AS oldest_eligible_at
FROM ai_usage_metering_outbox

-- name: ledger_row
SELECT id, tenant_id, user_id, model, input_tokens, output_tokens, cost_micros, occurred_at,
       created_at
FROM ai_usage_ledger WHERE id = :id

-- name: erased_subjects @postgres
-- Which of :ids (a JSON array of user / customer ids) an erasure has tombstoned.
SELECT subject_user_id FROM erasure_tombstones
WHERE subject_user_id IN (SELECT jsonb_array_elements_text(:ids))

-- name: erased_subjects @sqlite
SELECT subject_user_id FROM erasure_tombstones
WHERE subject_user_id IN (SELECT value FROM json_each(:ids))
