"""SQS-triggered consumers, one function per topic (serverless.yml binds each to its queue).

Each handler is the shared consumer wrapper: verify, dedupe, run, back off, dead-letter.
This module must stay free of the HTTP stack (FastAPI) so a consumer cold-starts light.
"""

from __future__ import annotations

from shared.core.services import Services
from shared.queues.topics import consumers_for

SERVICES = Services.from_env()
CONSUMERS = consumers_for(SERVICES)

ingest = CONSUMERS["rss.ingest"].lambda_handler
enrich = CONSUMERS["rss.enrich"].lambda_handler
cluster = CONSUMERS["rss.cluster"].lambda_handler
synthesize = CONSUMERS["rss.synthesize"].lambda_handler
