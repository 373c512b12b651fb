-- A build is reused, not reassembled, while its sources' stories are unchanged: each
-- source carries a token that changes whenever its stories are written, and each build the
-- tokens it was assembled from (see Catalog._build).

ALTER TABLE rss_sources ADD COLUMN stories_token text NULL;
ALTER TABLE rss_builds ADD COLUMN source_tokens jsonb NULL;
