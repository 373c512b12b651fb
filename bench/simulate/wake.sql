-- What the simulator's scheduler reads to decide whether a job's firing can do anything
-- (bench/simulate/firing.py). Reads only.

-- name: drain_wake
-- The earliest pending entry coming due that waits on nothing (a held entry waits for its
-- destination: sluice's claim takes it only as a probe, or once a pause ends), the oldest
-- pending entry's expiry clock (started_at, restarted when a pause ends, else enqueued_at),
-- the earliest in-flight lease end (an in-flight entry's next_attempt_at is its lease end),
-- the earliest probe of a failing destination holding entries (not before its pause ends;
-- never a disabled one: only the operator frees those), and the earliest pause to end.
SELECT min(next_attempt_at) FILTER (WHERE status = 'pending' AND held_by IS NULL) AS due,
       min(COALESCE(started_at, enqueued_at)) FILTER (WHERE status = 'pending') AS oldest,
       min(next_attempt_at) FILTER (WHERE status = 'in_flight') AS lease_end,
       (SELECT min(CASE WHEN paused_until > next_probe_at THEN paused_until
                        ELSE next_probe_at END)
        FROM delivery_destinations d
        WHERE down_since IS NOT NULL AND disabled_at IS NULL AND next_probe_at IS NOT NULL
          AND EXISTS (SELECT 1 FROM delivery_queue h
                      WHERE h.status = 'pending' AND h.held_by = d.key)) AS probe,
       (SELECT min(paused_until) FROM delivery_destinations
        WHERE paused_until IS NOT NULL) AS pause_end
FROM delivery_queue
WHERE status IN ('pending', 'in_flight')

-- name: tick_sources
-- Each source's fetch state: a failing one waits for next_attempt_at.
SELECT id, url, last_fetched_at, next_attempt_at FROM rss_sources ORDER BY id

-- name: erasure_wake
-- The earliest grace window to end, and whether a purge's sweep is still pending.
SELECT (SELECT min(grace_until) FROM data_erasure_requests WHERE status = 'requested') AS due,
       (SELECT count(*) FROM erasure_tombstones WHERE sweep_pending) AS sweeps
