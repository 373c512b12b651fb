-- The alert producer's effect records (delivery_effects rows with producer 'alert'):
-- kept fresh while their match is still seen, pruned once their story is gone.

-- name: touch @sqlite
-- At most one write per record a day: the sweep sees the same matches every tick.
UPDATE delivery_effects SET updated_at = :now
WHERE idempotency_key IN (SELECT value FROM json_each(:keys)) AND updated_at < :stale

-- name: touch @postgres
UPDATE delivery_effects SET updated_at = :now
WHERE idempotency_key IN (SELECT jsonb_array_elements_text(:keys))
  AND updated_at < :stale

-- name: prune
-- A record whose story no source stores any more (so no new build can hold it), not seen
-- in a build for :keep, and whose entry is gone too.
DELETE FROM delivery_effects
WHERE idempotency_key IN (
    SELECT e.idempotency_key FROM delivery_effects e
    WHERE e.producer = 'alert' AND e.updated_at < :before
      AND NOT EXISTS (SELECT 1 FROM rss_stories s WHERE s.id = e.subject)
      AND NOT EXISTS (SELECT 1 FROM delivery_queue q
                      WHERE q.idempotency_key = e.idempotency_key)
    ORDER BY e.updated_at
    LIMIT :limit
)
