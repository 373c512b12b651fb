-- The missed-run watch reads each job's newest scheduled run (RunStore.last_scheduled_runs,
-- for GET /api/admin/jobs, `sluice jobs` and the console) with one seek into this index
-- per job, however many runs of other triggers came after it: walking the job's whole
-- index instead made the job list grow with the history. The predicate is the query's
-- own (sluice.jobs.overdue.SCHEDULED_TRIGGERS), so both planners use it.

CREATE INDEX IF NOT EXISTS job_runs_scheduled_idx ON job_runs (job, started_at DESC)
WHERE trigger IN ('schedule', 'cron_http');
