-- RSS ingestion: sources, tenant scopes, stories per source, shared catalog builds and
-- their database lease (see shared/sluice/store/migrations/0006_rss.*.sql).

-- name: source_insert
INSERT INTO rss_sources (id, url, title, is_global, created_at)
VALUES (:id, :url, :title, :is_global, :now)

-- name: source_get
SELECT * FROM rss_sources WHERE id = :id

-- name: source_list
SELECT * FROM rss_sources ORDER BY created_at, id

-- name: source_global_ids
SELECT id FROM rss_sources WHERE is_global ORDER BY id

-- name: source_delete
DELETE FROM rss_sources WHERE id = :id

-- name: sources_by_ids @sqlite
SELECT * FROM rss_sources WHERE id IN (SELECT value FROM json_each(:ids)) ORDER BY id

-- name: sources_by_ids @postgres
SELECT * FROM rss_sources WHERE id IN (SELECT jsonb_array_elements_text(:ids)) ORDER BY id

-- name: source_fetched
UPDATE rss_sources
SET etag = :etag, last_modified = :last_modified, last_fetched_at = :now,
    last_success_at = :now, last_status = :status, last_error = :error,
    consecutive_failures = 0, next_attempt_at = NULL
WHERE id = :id

-- name: source_failed
UPDATE rss_sources
SET last_fetched_at = :now, last_status = :status, last_error = :error,
    consecutive_failures = consecutive_failures + 1, next_attempt_at = :next_attempt_at
WHERE id = :id

-- name: source_stories_changed
UPDATE rss_sources SET stories_token = :token WHERE id = :id

-- name: story_tokens @sqlite
SELECT id, stories_token FROM rss_sources WHERE id IN (SELECT value FROM json_each(:ids))
ORDER BY id

-- name: story_tokens @postgres
SELECT id, stories_token FROM rss_sources WHERE id IN (SELECT jsonb_array_elements_text(:ids))
ORDER BY id

-- name: story_upsert
INSERT INTO rss_stories (source_id, id, title, link, published_at, summary, first_seen_at)
VALUES (:source_id, :id, :title, :link, :published_at, :summary, :now)
ON CONFLICT (source_id, id) DO UPDATE
SET title = excluded.title, link = excluded.link, published_at = excluded.published_at,
    summary = excluded.summary

-- name: stories_prune
DELETE FROM rss_stories WHERE source_id = :source_id AND id NOT IN (
    SELECT id FROM rss_stories WHERE source_id = :source_id
    ORDER BY first_seen_at DESC, published_at DESC, id LIMIT :keep
)

-- name: stories_of_sources @sqlite
SELECT source_id, id, title, link, published_at, summary, first_seen_at FROM rss_stories
WHERE source_id IN (SELECT value FROM json_each(:ids))

-- name: stories_of_sources @postgres
SELECT source_id, id, title, link, published_at, summary, first_seen_at FROM rss_stories
WHERE source_id IN (SELECT jsonb_array_elements_text(:ids))

-- name: scope_upsert
INSERT INTO rss_scopes (scope_id, tenant_id, source_ids, locale, build_key, completed,
                        created_at, updated_at)
VALUES (:scope_id, :tenant_id, :source_ids, :locale, :build_key, :completed, :now, :now)
ON CONFLICT (scope_id) DO UPDATE
SET tenant_id = excluded.tenant_id, source_ids = excluded.source_ids,
    locale = excluded.locale, build_key = excluded.build_key,
    completed = excluded.completed, updated_at = excluded.updated_at

-- name: scope_get
SELECT * FROM rss_scopes WHERE scope_id = :scope_id

-- name: scope_list
SELECT * FROM rss_scopes ORDER BY scope_id

-- name: scope_completed_ids
SELECT scope_id FROM rss_scopes WHERE completed ORDER BY scope_id

-- name: scope_delete
DELETE FROM rss_scopes WHERE scope_id = :scope_id

-- name: scope_ids_for_build
SELECT scope_id FROM rss_scopes WHERE build_key = :build_key ORDER BY scope_id

-- name: scopes_for_build
SELECT * FROM rss_scopes WHERE build_key = :build_key ORDER BY scope_id

-- name: scope_refreshed
UPDATE rss_scopes SET last_refreshed_at = :now WHERE scope_id = :scope_id

-- name: scopes_using_source @sqlite
SELECT scope_id FROM rss_scopes
WHERE EXISTS (SELECT 1 FROM json_each(rss_scopes.source_ids) WHERE value = :source_id)
ORDER BY scope_id

-- name: scopes_using_source @postgres
SELECT scope_id FROM rss_scopes WHERE source_ids ? :source_id ORDER BY scope_id

-- name: build_get
-- The stories only when they are not the ones the caller holds already (:known, the
-- stories_id it read or wrote them under): a stories_id is written with its stories and
-- never names other ones (RssStore.build keeps the decoded stories by it).
SELECT key, source_ids, locale, built_at, expires_at, source_tokens, stories_id,
       CASE WHEN stories_id = :known THEN NULL ELSE stories END AS stories
FROM rss_builds WHERE key = :key

-- name: build_time
SELECT built_at FROM rss_builds WHERE key = :key

-- name: build_save
INSERT INTO rss_builds (key, source_ids, locale, built_at, expires_at, stories, source_tokens,
                        stories_id)
VALUES (:key, :source_ids, :locale, :built_at, :expires_at, :stories, :source_tokens,
        :stories_id)
ON CONFLICT (key) DO UPDATE
SET source_ids = excluded.source_ids, locale = excluded.locale, built_at = excluded.built_at,
    expires_at = excluded.expires_at, stories = excluded.stories,
    source_tokens = excluded.source_tokens, stories_id = excluded.stories_id

-- name: build_renew @sqlite
-- The stories stay: the row is the one they were assembled for (same set, locale, tokens).
UPDATE rss_builds SET built_at = :built_at, expires_at = :expires_at
WHERE key = :key AND source_ids = :source_ids AND locale = :locale
  AND source_tokens = :source_tokens

-- name: build_renew @postgres
UPDATE rss_builds SET built_at = :built_at, expires_at = :expires_at
WHERE key = :key AND source_ids = :source_ids AND locale = :locale
  AND source_tokens = :source_tokens

-- name: lock_acquire
INSERT INTO rss_build_locks (key, token, expires_at)
VALUES (:key, :token, :expires_at)
ON CONFLICT (key) DO UPDATE
SET token = excluded.token, expires_at = excluded.expires_at
WHERE rss_build_locks.expires_at < :now
RETURNING token

-- name: lock_release
DELETE FROM rss_build_locks WHERE key = :key AND token = :token
