-- delivery_chunks: the chunks of a chunked entry (a long Telegram or Slack message) that
-- the platform accepted, each with its message id, written as each answer comes and before
-- the next chunk is sent (shared/sluice/delivery/chunks.py). A retry of the entry resumes
-- after them, so an accepted chunk is never sent again. message_id NULL: the chunk was
-- refused for good and skipped (bestEffort). The rows go with their entry.
CREATE TABLE IF NOT EXISTS delivery_chunks (
    entry_id text NOT NULL REFERENCES delivery_queue (id) ON DELETE CASCADE,
    chunk integer NOT NULL,
    message_id text NULL,
    accepted_at timestamptz NOT NULL,
    PRIMARY KEY (entry_id, chunk)
);
