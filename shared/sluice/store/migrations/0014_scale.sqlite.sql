-- Scaling out past one function.
--
-- rss_fanout_ticks: one row per tick that fanned its builds out over rss.ingest: what
-- the tick published, and what the consumers did with it (built, shared with a build
-- made elsewhere, locked out, failed) and how long the messages waited (the lag).
-- Kept for the operations page; state-cleanup is not needed, the tick prunes old rows.
CREATE TABLE IF NOT EXISTS rss_fanout_ticks (
    tick_id text PRIMARY KEY,
    started_at timestamptz NOT NULL,
    due integer NOT NULL DEFAULT 0,
    published integer NOT NULL DEFAULT 0,
    publish_failed integer NOT NULL DEFAULT 0,
    built integer NOT NULL DEFAULT 0,
    shared integer NOT NULL DEFAULT 0,
    locked integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    lag_max_ms bigint NOT NULL DEFAULT 0,
    lag_sum_ms bigint NOT NULL DEFAULT 0,
    last_done_at timestamptz NULL
);
CREATE INDEX IF NOT EXISTS rss_fanout_ticks_started_idx ON rss_fanout_ticks (started_at);

-- delivery_rate_limits: the next moment (epoch microseconds) one more message may go to
-- a rate-limited destination (a bot, a chat, a Slack channel, a webhook host), shared by
-- every concurrent sender when Redis is not configured.
CREATE TABLE IF NOT EXISTS delivery_rate_limits (
    key text PRIMARY KEY,
    next_at_us bigint NOT NULL
);
