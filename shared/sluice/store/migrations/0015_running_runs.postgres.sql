-- A new run marks its job's unfinished runs as abandoned (abandon_running): a probe of
-- this index instead of a walk through every run of the job that the retention keeps.

CREATE INDEX IF NOT EXISTS job_runs_running_idx ON job_runs (job) WHERE outcome = 'running';
