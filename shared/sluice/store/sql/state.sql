-- The platform_state key-value store and its hash companion.

-- name: get
SELECT key, value, expires_at, updated_at FROM platform_state
WHERE key = :key AND (expires_at IS NULL OR expires_at > :now)

-- name: put
INSERT INTO platform_state (key, value, expires_at, updated_at)
VALUES (:key, :value, :expires_at, :now)
ON CONFLICT (key) DO UPDATE
SET value = excluded.value, expires_at = excluded.expires_at, updated_at = excluded.updated_at

-- name: delete
DELETE FROM platform_state WHERE key = :key

-- name: list_keys_by_prefix
SELECT key FROM platform_state
WHERE key LIKE :pattern ESCAPE '\' AND (expires_at IS NULL OR expires_at > :now)
ORDER BY key

-- name: hash_put
INSERT INTO platform_state_hash (key, field, value, updated_at)
VALUES (:key, :field, :value, :now)
ON CONFLICT (key, field) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at

-- name: hash_get_all
SELECT field, value, updated_at FROM platform_state_hash WHERE key = :key ORDER BY field

-- name: delete_expired_batch
DELETE FROM platform_state WHERE key IN (
    SELECT key FROM platform_state
    WHERE expires_at IS NOT NULL AND expires_at < :now
    LIMIT :limit
)

-- name: delete_expired_batch @postgres
-- ctid = ANY(ARRAY(...)) is a TID scan: no second index lookup per row.
DELETE FROM platform_state WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM platform_state
    WHERE expires_at IS NOT NULL AND expires_at < :now
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
))

-- name: delete_stale_hash_batch
DELETE FROM platform_state_hash WHERE (key, field) IN (
    SELECT key, field FROM platform_state_hash
    WHERE key LIKE :pattern ESCAPE '\' AND updated_at < :cutoff
    LIMIT :limit
)

-- name: delete_stale_hash_batch @postgres
DELETE FROM platform_state_hash WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM platform_state_hash
    WHERE key LIKE :pattern ESCAPE '\' AND updated_at < :cutoff
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
))

-- name: count_expired
SELECT count(*) AS n FROM platform_state WHERE expires_at IS NOT NULL AND expires_at < :now

-- name: delete_expired_builds_batch
-- The feed caches (rss_builds) of source sets no scope reads any more: a build a scope
-- uses is renewed each tick, so one expired since :cutoff is abandoned (a later read
-- builds it again whole).
DELETE FROM rss_builds WHERE key IN (
    SELECT key FROM rss_builds WHERE expires_at < :cutoff LIMIT :limit
)

-- name: delete_expired_build_locks_batch
-- An expired build lease is free (lock_acquire takes it over): its row is only kept space.
DELETE FROM rss_build_locks WHERE key IN (
    SELECT key FROM rss_build_locks WHERE expires_at < :now LIMIT :limit
)
