-- A request whose purge raised is no longer failed after a bound of attempts: it stays
-- requested and every erasure-purge run tries it again (paging each run it fails in).
-- Requests failed by the old bound (failed, never purged: purged_at is set by every purge
-- that committed) are due again, so the next run tries them.

UPDATE data_erasure_requests
SET status = 'requested'
WHERE status = 'failed' AND purged_at IS NULL AND purge_attempts > 0;
