-- RSS ingestion: feed sources with their fetch state, tenant scopes (a tenant's source
-- set and content locale), the stories last seen per source, catalog builds shared by
-- every scope with the same source set and locale, and the database lease that stops
-- two instances building one set at once when Redis is not configured.

CREATE TABLE IF NOT EXISTS rss_sources (
    id text PRIMARY KEY,
    url text NOT NULL UNIQUE,
    title text NULL,
    is_global boolean NOT NULL DEFAULT 0,
    etag text NULL,
    last_modified text NULL,
    last_fetched_at timestamptz NULL,
    last_success_at timestamptz NULL,
    last_status integer NULL,
    last_error text NULL,
    consecutive_failures integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NULL,
    created_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS rss_sources_global_idx ON rss_sources (is_global) WHERE is_global = 1;

CREATE TABLE IF NOT EXISTS rss_scopes (
    scope_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    source_ids jsonb NOT NULL,
    locale text NOT NULL,
    build_key text NOT NULL,
    completed boolean NOT NULL DEFAULT 1,
    last_refreshed_at timestamptz NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS rss_scopes_completed_idx ON rss_scopes (scope_id) WHERE completed = 1;
CREATE INDEX IF NOT EXISTS rss_scopes_build_key_idx ON rss_scopes (build_key);

CREATE TABLE IF NOT EXISTS rss_stories (
    source_id text NOT NULL REFERENCES rss_sources (id) ON DELETE CASCADE,
    id text NOT NULL,
    title text NOT NULL,
    link text NULL,
    published_at timestamptz NULL,
    summary text NOT NULL,
    first_seen_at timestamptz NOT NULL,
    PRIMARY KEY (source_id, id)
);
CREATE INDEX IF NOT EXISTS rss_stories_recent_idx ON rss_stories (source_id, first_seen_at DESC);

CREATE TABLE IF NOT EXISTS rss_builds (
    key text PRIMARY KEY,
    source_ids jsonb NOT NULL,
    locale text NOT NULL,
    built_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    stories jsonb NOT NULL
);

CREATE TABLE IF NOT EXISTS rss_build_locks (
    key text PRIMARY KEY,
    token text NOT NULL,
    expires_at timestamptz NOT NULL
);
