"""The rss pack: feed sources and tenant scopes, the rss-refresh tick, and the ``rss.*``
topics. ``rss.ingest`` keeps the reference message shape (``batchId``, ``sourceId``,
``feedUrl``, ``publishedAt`` first, any other field after) and the reference key, byte for
byte what the JavaScript producer sends (docs/examples/app.js)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sluice.core.times import iso_z
from sluice.extend import Job, MessageField, Settings, Topic
from sluice.queues.keys import reference_key


def _batch_id(now: datetime) -> str:
    return str(uuid.uuid4())


JOBS = [
    Job(name="rss-refresh", route="/api/admin/rss/refresh", schedule="rate(10 minutes)",
        surface="ingestion", target="sluice.rss.tick:run_rss_refresh", failure_keys=("failed",),
        budget_s=290.0, timeout_s=300, publishes=("rss.ingest",)),
]

TOPICS = [
    # each build writes to Postgres and fetches feeds: cap the fan-out (a setting, read when
    # the template is deployed). A repeated build is shared, not redone, and the alerts it
    # raises are enqueued under their idempotency keys, so a batch's completions are
    # written once.
    Topic("rss.ingest", "sluice.queues.handlers:ingest_handler",
          max_concurrency=Settings._field_defaults["rss_ingest_concurrency"],
          concurrency_var="SLUICE_RSS_INGEST_CONCURRENCY", idempotent=True,
          fields=(MessageField("batchId", default=_batch_id),
                  MessageField("sourceId", default="all-sources"),
                  MessageField("feedUrl", default=""),
                  MessageField("publishedAt", default=iso_z)),
          other_fields=True, key=reference_key),
    # reserved: nothing publishes to them, and a stray message fails loud; their messages'
    # shape is not fixed yet, so they take any field
    Topic("rss.enrich", other_fields=True),
    Topic("rss.cluster", other_fields=True),
    Topic("rss.synthesize", other_fields=True),
]
