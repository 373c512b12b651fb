"""SQS-triggered consumers: one function per topic, each naming its topic in ``SLUICE_TOPIC``.

The handler is the shared consumer wrapper: verify, dedupe, run, back off, dead-letter.
Without a signing secret the module fails to import, so the function never consumes
(its messages stay on the queue, then the redrive policy moves them to the DLQ).
This module must stay free of the HTTP stack (FastAPI) so a consumer cold-starts light.
"""

from __future__ import annotations

import os

from sluice.lambda_handlers import cold_start

with cold_start():
    from sluice.core.errors import ConfigurationError
    from sluice.core.services import Services
    from sluice.queues.runtime import consumers_for
    from sluice.queues.topics import get_topic

    if not os.environ.get("SLUICE_TOPIC"):
        raise ConfigurationError("SLUICE_TOPIC must name the topic this function consumes")
    TOPIC = get_topic(os.environ["SLUICE_TOPIC"])
    SERVICES = Services.from_env()
    CONSUMER = consumers_for(SERVICES, topics=(TOPIC.name,))[TOPIC.name]

    handler = CONSUMER.lambda_handler
