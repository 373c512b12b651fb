-- Job runs, single-flight leases and the admin audit trail.

-- name: acquire_lease
INSERT INTO job_leases (job, holder, acquired_at, expires_at)
VALUES (:job, :holder, :now, :expires_at)
ON CONFLICT (job) DO UPDATE
SET holder = excluded.holder, acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE job_leases.expires_at < excluded.acquired_at
RETURNING holder

-- name: lease_holder
SELECT holder, expires_at FROM job_leases WHERE job = :job

-- name: take_over_lease
UPDATE job_leases SET holder = :holder, acquired_at = :now, expires_at = :expires_at
WHERE job = :job AND holder = :previous

-- name: release_lease
DELETE FROM job_leases WHERE job = :job AND holder = :holder

-- name: start_run
INSERT INTO job_runs (id, job, trigger, request_id, started_at, outcome)
VALUES (:id, :job, :trigger, :request_id, :started_at, :outcome)

-- name: finish_run
UPDATE job_runs
SET finished_at = :finished_at, duration_ms = :duration_ms, outcome = :outcome, result = :result
WHERE id = :id

-- name: record_run
INSERT INTO job_runs (id, job, trigger, request_id, started_at, finished_at, duration_ms, outcome, result)
VALUES (:id, :job, :trigger, :request_id, :started_at, :finished_at, :duration_ms, :outcome, :result)

-- name: last_runs @postgres
-- The latest run of each job in :jobs (a JSON array): one index probe per job
-- (job_runs_job_started_idx), whatever the length of the history.
SELECT r.job, r.trigger, r.started_at, r.finished_at, r.duration_ms, r.outcome, r.result
FROM jsonb_array_elements_text(:jobs) AS j(job)
CROSS JOIN LATERAL (
    SELECT * FROM job_runs WHERE job = j.job ORDER BY started_at DESC LIMIT 1
) r

-- name: last_runs @sqlite
SELECT r.job, r.trigger, r.started_at, r.finished_at, r.duration_ms, r.outcome, r.result
FROM json_each(:jobs) j
JOIN job_runs r ON r.id = (
    SELECT id FROM job_runs WHERE job = j.value ORDER BY started_at DESC LIMIT 1
)

-- name: last_scheduled_runs @postgres
-- When the scheduler last started each job in :jobs (the missed-run watch), no later than
-- :now (a run recorded by a clock ahead is not the newest): one seek per job into
-- job_runs_scheduled_idx, whose predicate is the trigger filter here, whatever the history.
SELECT j.job, r.started_at
FROM jsonb_array_elements_text(:jobs) AS j(job)
CROSS JOIN LATERAL (
    SELECT started_at FROM job_runs
    WHERE job = j.job AND trigger IN ('schedule', 'cron_http') AND started_at <= :now
    ORDER BY started_at DESC LIMIT 1
) r

-- name: last_scheduled_runs @sqlite
SELECT r.job, r.started_at
FROM json_each(:jobs) j
JOIN job_runs r ON r.id = (
    SELECT id FROM job_runs
    WHERE job = j.value AND trigger IN ('schedule', 'cron_http') AND started_at <= :now
    ORDER BY started_at DESC LIMIT 1
)

-- name: recent_runs
SELECT id, job, trigger, request_id, started_at, finished_at, duration_ms, outcome, result
FROM job_runs WHERE job = :job ORDER BY started_at DESC LIMIT :limit

-- name: run_by_request
-- A handed-off run, found again by the request id the console gave it (job_runs_request_idx).
SELECT id, job, trigger, request_id, started_at, finished_at, duration_ms, outcome, result
FROM job_runs WHERE request_id = :request_id AND job = :job
ORDER BY started_at DESC LIMIT 1

-- name: audit
INSERT INTO admin_audit (id, actor, action, target, outcome, ip, at, detail)
VALUES (:id, :actor, :action, :target, :outcome, :ip, :at, :detail)

-- name: complete_audit
UPDATE admin_audit SET outcome = :outcome, detail = :detail, target = coalesce(:target, target)
WHERE id = :id

-- name: progress_audit
-- How far a started action got, written as it goes (in the action's own transaction when
-- it has one): a process killed part way leaves its row saying what it did.
UPDATE admin_audit SET detail = :detail WHERE id = :id AND outcome = 'started'

-- name: discard_audit
DELETE FROM admin_audit WHERE id = :id AND outcome = 'started'

-- name: delete_old_runs_batch
DELETE FROM job_runs WHERE id IN (
    SELECT id FROM job_runs WHERE started_at < :cutoff LIMIT :limit
)

-- name: delete_old_audit_batch
DELETE FROM admin_audit WHERE id IN (
    SELECT id FROM admin_audit WHERE at < :cutoff LIMIT :limit
)

-- name: recent_audit
SELECT id, actor, action, target, outcome, ip, at, detail
FROM admin_audit ORDER BY at DESC LIMIT :limit

-- name: lease_is_mine @postgres
-- FOR SHARE: a takeover of the lease waits until the transaction holding this ends.
SELECT holder FROM job_leases
WHERE job = :job AND holder = :holder AND expires_at > :now
FOR SHARE

-- name: lease_is_mine @sqlite
SELECT holder FROM job_leases WHERE job = :job AND holder = :holder AND expires_at > :now

-- name: abandon_running
-- Runs of the job still 'running' when a new run holds its lease never finished:
-- killed, or hung past their lease.
UPDATE job_runs
SET outcome = 'error', finished_at = :now, result = :result
WHERE job = :job AND outcome = 'running'

-- name: find_audit
-- The trail, newest first, each filter applied only when given (targets by prefix).
SELECT id, actor, action, target, outcome, ip, at, detail
FROM admin_audit
WHERE (CAST(:actor AS text) IS NULL OR actor = :actor)
  AND (CAST(:action AS text) IS NULL OR action = :action)
  AND (CAST(:target AS text) IS NULL
       OR substr(target, 1, length(CAST(:target AS text))) = CAST(:target AS text))
  AND (CAST(:since AS timestamptz) IS NULL OR at >= :since)
  AND (CAST(:until AS timestamptz) IS NULL OR at < :until)
ORDER BY at DESC, id DESC LIMIT :limit
