-- Retention of the run log and the audit trail: state-cleanup deletes job_runs
-- older than SLUICE_JOB_RUNS_RETENTION_DAYS and admin_audit rows older than
-- SLUICE_AUDIT_RETENTION_DAYS in batches, by these indexes. The last run per job
-- is read with one probe per job on job_runs_job_started_idx (0001).

CREATE INDEX IF NOT EXISTS job_runs_started_idx ON job_runs (started_at);
CREATE INDEX IF NOT EXISTS job_runs_job_started_idx ON job_runs (job, started_at DESC);
