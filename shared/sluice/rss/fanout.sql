-- The tick's fan-out over rss.ingest: when each build was made, and one row per tick
-- with what it published and what the consumers did (shared/sluice/store/migrations/0014_scale.*.sql).

-- name: build_times
SELECT key, built_at FROM rss_builds

-- name: tick_start
INSERT INTO rss_fanout_ticks (tick_id, started_at, due) VALUES (:tick_id, :now, :due)

-- name: tick_published
UPDATE rss_fanout_ticks SET published = :published, publish_failed = :publish_failed
WHERE tick_id = :tick_id

-- name: tick_outcome
-- One consumer's outcome, added in one statement so concurrent consumers never lose one.
UPDATE rss_fanout_ticks
SET built = built + :built, shared = shared + :shared, locked = locked + :locked,
    failed = failed + :failed, lag_sum_ms = lag_sum_ms + :lag_ms,
    lag_max_ms = CASE WHEN lag_max_ms < :lag_ms THEN :lag_ms ELSE lag_max_ms END,
    last_done_at = :now
WHERE tick_id = :tick_id

-- name: tick_get
SELECT * FROM rss_fanout_ticks WHERE tick_id = :tick_id

-- name: tick_recent
SELECT * FROM rss_fanout_ticks ORDER BY started_at DESC, tick_id DESC LIMIT :limit

-- name: tick_prune
DELETE FROM rss_fanout_ticks WHERE started_at < :before
