-- A build's stories get an id of their own, written with them (and kept when the build is
-- renewed): a process that holds a build's stories decoded under that id reads the row
-- without them (see RssStore.build). NULL: a build saved before this column, read whole.

ALTER TABLE rss_builds ADD COLUMN IF NOT EXISTS stories_id text NULL;
