"""RSS ingestion: feed sources, tenant scopes, catalog builds shared by source set and
locale, the ten-minute ``rss-refresh`` tick and the ``rss.ingest`` global refresh."""
