-- The console finds a run it handed to a job's function by the request id it gave it
-- (RunStore.by_request): a probe, not a walk through the job's retained runs.

CREATE INDEX IF NOT EXISTS job_runs_request_idx ON job_runs (request_id);
