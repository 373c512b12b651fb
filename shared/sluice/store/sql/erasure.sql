-- GDPR erasure: the request lifecycle, and one count_/purge_ pair per registry
-- target (shared/sluice/erasure/registry.py names them; a test checks every pair exists).
-- Purge parameters: :subject (the user id), :pseudonym (what pseudonymised
-- columns become), :s_exact / :s_prefix / :s_infix / :s_suffix (the user's
-- platform_state key segments, raw) and :p_prefix / :p_infix / :p_suffix (the
-- same as LIKE patterns, escaped with '\').

-- name: insert_request
INSERT INTO data_erasure_requests
    (id, subject_user_id, tenant_id, status, requested_by, requested_at, grace_until, updated_at)
VALUES (:id, :subject_user_id, :tenant_id, 'requested', :requested_by, :requested_at,
        :grace_until, :requested_at)

-- name: get_request
SELECT * FROM data_erasure_requests WHERE id = :id

-- name: lock_request
SELECT * FROM data_erasure_requests WHERE id = :id

-- name: lock_request @postgres
SELECT * FROM data_erasure_requests WHERE id = :id FOR UPDATE

-- name: open_request_for_subject
SELECT * FROM data_erasure_requests WHERE subject_user_id = :subject AND status = 'requested'

-- name: list_requests
SELECT * FROM data_erasure_requests
WHERE (CAST(:status AS text) IS NULL OR status = :status)
  AND (CAST(:subject AS text) IS NULL OR subject_user_id = :subject)
ORDER BY requested_at DESC, id
LIMIT :limit

-- name: list_due
-- Requests never tried first: a request whose purge keeps raising is tried again every run,
-- never ahead of one that has not been tried.
SELECT * FROM data_erasure_requests
WHERE status = 'requested' AND grace_until <= :now
ORDER BY purge_attempts, grace_until, id
LIMIT :limit

-- name: count_due
SELECT count(*) AS n FROM data_erasure_requests WHERE status = 'requested' AND grace_until <= :now

-- name: count_by_status
SELECT status, count(*) AS n FROM data_erasure_requests GROUP BY status

-- name: cancel_request
UPDATE data_erasure_requests SET status = 'cancelled', updated_at = :now
WHERE id = :id AND status = 'requested'

-- name: mark_purged
UPDATE data_erasure_requests
SET status = 'purged', purged_at = :now, confirmed_by = :confirmed_by, result = :result,
    last_error = NULL, verified_at = NULL, updated_at = :now
WHERE id = :id

-- name: mark_verified
-- A failed request whose retried sweep now verifies clean is purged after all.
UPDATE data_erasure_requests
SET status = 'purged', verified_at = :now, result = :result, last_error = NULL, updated_at = :now
WHERE id = :id AND status IN ('purged', 'failed')

-- --- Tombstones (erasure_tombstones): one per erased subject -------------------

-- name: put_tombstone
INSERT INTO erasure_tombstones (subject_user_id, request_id, erased_at, sweep_pending)
VALUES (:subject, :id, :now, true)
ON CONFLICT (subject_user_id) DO UPDATE
SET request_id = excluded.request_id, erased_at = excluded.erased_at, sweep_pending = true

-- name: sweep_done
UPDATE erasure_tombstones SET sweep_pending = false
WHERE subject_user_id = :subject AND request_id = :id

-- name: list_sweep_pending
-- Purges whose sweep outside the transaction never succeeded (a crash after the
-- commit, or Redis down): every erasure-purge run tries them again.
SELECT r.* FROM erasure_tombstones t
JOIN data_erasure_requests r ON r.id = t.request_id
WHERE t.sweep_pending
ORDER BY t.erased_at, r.id
LIMIT :limit

-- name: tombstone_for
SELECT subject_user_id, request_id, erased_at, sweep_pending FROM erasure_tombstones
WHERE subject_user_id = :subject

-- name: mark_failed
UPDATE data_erasure_requests
SET status = 'failed', result = :result, last_error = :last_error, updated_at = :now
WHERE id = :id

-- --- Targets: the AI usage ledger ------------------------------------------

-- name: count_ledger
SELECT count(*) AS n FROM ai_usage_ledger WHERE user_id = :subject

-- name: purge_ledger
DELETE FROM ai_usage_ledger WHERE user_id = :subject

-- --- Targets: the metering outbox (runs before the ledger: it follows ledger_id) --

-- name: count_outbox
SELECT count(*) AS n FROM ai_usage_metering_outbox
WHERE id IN (
    SELECT id FROM ai_usage_metering_outbox WHERE external_customer_id = :subject
    UNION
    SELECT o.id FROM ai_usage_metering_outbox o
    JOIN ai_usage_ledger l ON l.id = o.ledger_id
    WHERE l.user_id = :subject
)

-- name: purge_outbox
DELETE FROM ai_usage_metering_outbox
WHERE id IN (
    SELECT id FROM ai_usage_metering_outbox WHERE external_customer_id = :subject
    UNION
    SELECT o.id FROM ai_usage_metering_outbox o
    JOIN ai_usage_ledger l ON l.id = o.ledger_id
    WHERE l.user_id = :subject
)

-- --- Targets: platform_state keys scoped to the user ------------------------
-- A key belongs to user U when one of its ':'-separated segment pairs is
-- 'user:U': 'user:U', 'user:U:…', '…:user:U:…' or '…:user:U'. Compared
-- case-sensitively on both engines (the store turns on SQLite's case_sensitive_like).

-- name: count_state
SELECT count(*) AS n FROM platform_state
WHERE key = :s_exact OR key LIKE :p_prefix ESCAPE '\'
   OR key LIKE :p_infix ESCAPE '\' OR key LIKE :p_suffix ESCAPE '\'

-- name: purge_state
DELETE FROM platform_state
WHERE key = :s_exact OR key LIKE :p_prefix ESCAPE '\'
   OR key LIKE :p_infix ESCAPE '\' OR key LIKE :p_suffix ESCAPE '\'

-- name: count_state_hash
SELECT count(*) AS n FROM platform_state_hash
WHERE key = :s_exact OR key LIKE :p_prefix ESCAPE '\'
   OR key LIKE :p_infix ESCAPE '\' OR key LIKE :p_suffix ESCAPE '\'

-- name: purge_state_hash
DELETE FROM platform_state_hash
WHERE key = :s_exact OR key LIKE :p_prefix ESCAPE '\'
   OR key LIKE :p_infix ESCAPE '\' OR key LIKE :p_suffix ESCAPE '\'

-- --- Targets: the delivery queue (entries addressed to the subject) -----------

-- name: count_delivery
-- The subject's entries: named in subject_user_id, or addressed to the subject's id
-- itself (a Slack user id, a Telegram chat id, an address used as the user id).
-- Email addresses compare without regard to case.
SELECT count(*) AS n FROM delivery_queue
WHERE subject_user_id = :subject OR recipient = :subject
   OR (channel = 'email' AND lower(recipient) = lower(:subject))

-- name: purge_delivery
DELETE FROM delivery_queue
WHERE subject_user_id = :subject OR recipient = :subject
   OR (channel = 'email' AND lower(recipient) = lower(:subject))

-- --- Targets: actor references, pseudonymised -------------------------------

-- The actor's rows, and rows already pseudonymised for this subject that still hold
-- the address the request came from (detail.forwardedFor, kept by an older purge).

-- name: count_audit_actor @postgres
SELECT count(*) AS n FROM admin_audit
WHERE actor = :subject
   OR (detail ->> 'forwardedFor' IS NOT NULL
       AND actor IN (SELECT 'erased:' || id FROM data_erasure_requests
                     WHERE subject_user_id = :subject))

-- name: count_audit_actor @sqlite
SELECT count(*) AS n FROM admin_audit
WHERE actor = :subject
   OR (json_extract(detail, '$.forwardedFor') IS NOT NULL
       AND actor IN (SELECT 'erased:' || id FROM data_erasure_requests
                     WHERE subject_user_id = :subject))

-- name: purge_audit_actor @postgres
UPDATE admin_audit
SET actor = CASE WHEN actor = :subject THEN :pseudonym ELSE actor END, ip = NULL,
    detail = CASE WHEN detail IS NULL THEN NULL ELSE detail - 'forwardedFor' END
WHERE actor = :subject
   OR (detail ->> 'forwardedFor' IS NOT NULL
       AND actor IN (SELECT 'erased:' || id FROM data_erasure_requests
                     WHERE subject_user_id = :subject))

-- name: purge_audit_actor @sqlite
UPDATE admin_audit
SET actor = CASE WHEN actor = :subject THEN :pseudonym ELSE actor END, ip = NULL,
    detail = json_remove(detail, '$.forwardedFor')
WHERE actor = :subject
   OR (json_extract(detail, '$.forwardedFor') IS NOT NULL
       AND actor IN (SELECT 'erased:' || id FROM data_erasure_requests
                     WHERE subject_user_id = :subject))

-- name: count_requested_by
SELECT count(*) AS n FROM data_erasure_requests WHERE requested_by = :subject

-- name: purge_requested_by
UPDATE data_erasure_requests SET requested_by = :pseudonym WHERE requested_by = :subject

-- name: count_confirmed_by
SELECT count(*) AS n FROM data_erasure_requests WHERE confirmed_by = :subject

-- name: purge_confirmed_by
UPDATE data_erasure_requests SET confirmed_by = :pseudonym WHERE confirmed_by = :subject

-- --- Schema inspection (the registry test and `sluice erasure registry --check`) --

-- name: schema_columns @postgres
SELECT table_name AS "table", column_name AS "column"
FROM information_schema.columns
WHERE table_schema = current_schema()
ORDER BY table_name, ordinal_position

-- name: schema_columns @sqlite
SELECT m.name AS "table", p.name AS "column"
FROM sqlite_master m JOIN pragma_table_info(m.name) p
WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'
ORDER BY m.name, p.cid

-- name: schema_tables @postgres
SELECT table_name AS "table" FROM information_schema.tables
WHERE table_schema = current_schema()

-- name: schema_tables @sqlite
SELECT name AS "table" FROM sqlite_master WHERE type = 'table'

-- --- Targets: alert rules addressed to the subject -----------------------------
-- Rows 'platform:alerts-rules:<scope>' hold {"rules": [...]}; a rule whose
-- destination.recipient is the subject id (any case: an email address) is removed
-- from its list, the other rules stay.

-- name: count_alert_rules @postgres
SELECT count(*) AS n FROM platform_state s, jsonb_array_elements(s.value -> 'rules') r
WHERE s.key LIKE 'platform:alerts-rules:%'
  AND lower(r -> 'destination' ->> 'recipient') = lower(:subject)

-- name: count_alert_rules @sqlite
SELECT count(*) AS n FROM platform_state s, json_each(s.value, '$.rules') r
WHERE substr(s.key, 1, 22) = 'platform:alerts-rules:'
  AND lower(json_extract(r.value, '$.destination.recipient')) = lower(:subject)

-- name: purge_alert_rules @postgres
UPDATE platform_state SET updated_at = now(), value = jsonb_set(value, '{rules}', (
    SELECT coalesce(jsonb_agg(e.r ORDER BY e.o), '[]'::jsonb)
    FROM jsonb_array_elements(value -> 'rules') WITH ORDINALITY AS e(r, o)
    WHERE lower(e.r -> 'destination' ->> 'recipient') IS DISTINCT FROM lower(:subject)))
WHERE key LIKE 'platform:alerts-rules:%'
  AND EXISTS (SELECT 1 FROM jsonb_array_elements(value -> 'rules') r
              WHERE lower(r -> 'destination' ->> 'recipient') = lower(:subject))

-- name: purge_alert_rules @sqlite
UPDATE platform_state SET value = json_set(value, '$.rules', (
    SELECT json_group_array(json(r.value)) FROM json_each(platform_state.value, '$.rules') r
    WHERE coalesce(lower(json_extract(r.value, '$.destination.recipient')), '')
          <> lower(:subject)))
WHERE substr(key, 1, 22) = 'platform:alerts-rules:'
  AND EXISTS (SELECT 1 FROM json_each(platform_state.value, '$.rules') r
              WHERE lower(json_extract(r.value, '$.destination.recipient')) = lower(:subject))

-- name: record_purge_error
-- A purge that raised and rolled back: one attempt more, and why. The request stays
-- requested, so it is still due and every run tries it again until it succeeds (each run
-- it fails in counts it in `failed`, which pages). Only while still requested.
UPDATE data_erasure_requests
SET purge_attempts = purge_attempts + 1,
    result = :result, last_error = :last_error, updated_at = :now
WHERE id = :id AND status = 'requested'
RETURNING purge_attempts
