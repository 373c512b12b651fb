-- What the simulator's scheduler reads to decide whether a job's firing can do anything
-- (bench/simulate/firing.py). Reads only.

-- name: drain_wake
-- The earliest pending entry coming due, the oldest pending entry (its expiry), the
-- earliest in-flight lease end (an in-flight entry's next_attempt_at is its lease end).
SELECT min(next_attempt_at) FILTER (WHERE status = 'pending') AS due,
       min(enqueued_at) FILTER (WHERE status = 'pending') AS oldest,
       min(next_attempt_at) FILTER (WHERE status = 'in_flight') AS lease_end
FROM delivery_queue
WHERE status IN ('pending', 'in_flight')

-- name: tick_sources
-- Each source's fetch state: a failing one waits for next_attempt_at.
SELECT id, url, last_fetched_at, next_attempt_at FROM rss_sources ORDER BY id

-- name: erasure_wake
-- The earliest grace window to end, and whether a purge's sweep is still pending.
SELECT (SELECT min(grace_until) FROM data_erasure_requests WHERE status = 'requested') AS due,
       (SELECT count(*) FROM erasure_tombstones WHERE sweep_pending) AS sweeps
