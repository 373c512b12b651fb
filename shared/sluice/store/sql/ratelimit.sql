-- Delivery rate limits shared by concurrent senders when Redis is not configured
-- (shared/sluice/store/migrations/0014_scale.*.sql): the next moment, in epoch microseconds, one more
-- message may go to a key.

-- name: rate_ensure
-- A key's first use; an existing row is left alone (and not locked).
INSERT INTO delivery_rate_limits (key, next_at_us) VALUES (:key, 0)
ON CONFLICT (key) DO NOTHING

-- name: rate_lock @postgres
-- Locked in key order, so two senders taking overlapping keys never deadlock.
SELECT key, next_at_us FROM delivery_rate_limits
WHERE key IN (SELECT jsonb_array_elements_text(:keys))
ORDER BY key
FOR UPDATE

-- name: rate_lock @sqlite
-- SQLite serialises writers (BEGIN IMMEDIATE): the read cannot race.
SELECT key, next_at_us FROM delivery_rate_limits
WHERE key IN (SELECT value FROM json_each(:keys))
ORDER BY key

-- name: rate_set
-- An upsert: a row state-cleanup removed after this sender's rate_ensure is written again.
INSERT INTO delivery_rate_limits (key, next_at_us) VALUES (:key, :next_at_us)
ON CONFLICT (key) DO UPDATE SET next_at_us = excluded.next_at_us

-- name: rate_slow
-- A provider asked us to wait: the key's next slot moves to at least then, never earlier.
INSERT INTO delivery_rate_limits (key, next_at_us) VALUES (:key, :until_us)
ON CONFLICT (key) DO UPDATE
SET next_at_us = CASE WHEN delivery_rate_limits.next_at_us < excluded.next_at_us
                      THEN excluded.next_at_us ELSE delivery_rate_limits.next_at_us END

-- name: rate_overrides
-- The operators' rate overrides in force (shared/sluice/delivery/destinations.py sets them):
-- every sender reads the same ones.
SELECT key, rate_limit, rate_period_s, rate_until FROM delivery_destinations
WHERE rate_until > :now

-- name: prune_rates
-- state-cleanup: a key whose next slot is long past (before :before_us) spaces nothing a
-- missing row would not (a sender counts from now either way).
DELETE FROM delivery_rate_limits
WHERE key IN (SELECT key FROM delivery_rate_limits WHERE next_at_us < :before_us LIMIT :limit)
