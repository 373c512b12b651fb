"""The local push endpoint: ``POST /api/queues/<topic, dots as slashes>`` (``sluice dev``).

On AWS a topic's queue pushes each message to its consumer function; locally ``sluice dev``
serves one route per topic that does the same, so a producer in any language can hand a
signed message to the consumer and see what it did. The route runs the topic's consumer
exactly as the queue would, signature check first: a forged, malformed or misrouted message
is quarantined and acknowledged (``200``, outcome ``rejected``: retrying a forgery is
pointless), a handled one is ``done`` or ``duplicate``, a failed one is retried in process
and dead-lettered (``200``, ``dead_lettered``), and a store outage is a ``503`` (the
message is not taken: send it again). Only ``sluice dev`` mounts these routes: they take no
admin identity, so the message's signature is their only credential, and a deployment never
serves them (its queues invoke the consumer functions directly).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from sluice.core.errors import RequestError, UpstreamUnavailable
from sluice.core.services import Services
from sluice.queues.consumer import Consumer, MessageOutcome
from sluice.queues.runtime import consumers_for
from sluice.queues.signing import MissingSecret
from sluice.queues.topics import TOPICS

PREFIX = "/api/queues/"
MAX_MESSAGE_BYTES = 262_144  # SQS's own limit of a message body
_MESSAGE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# What the pusher is answered: 2xx acknowledges (the message is settled), else send again.
STATUS_OF = {MessageOutcome.DONE: 200, MessageOutcome.DUPLICATE: 200,
             MessageOutcome.REJECTED: 200, MessageOutcome.DEAD_LETTERED: 200,
             MessageOutcome.RETRY: 500, MessageOutcome.WAITING: 503}


def route_of(topic: str) -> str:
    """``rss.ingest`` -> ``/api/queues/rss/ingest``: the topic's dots become path segments."""
    return PREFIX + topic.replace(".", "/")


def push_router(services: Services) -> APIRouter:
    """One ``POST`` route per topic, each running that topic's consumer."""
    try:
        consumers: dict[str, Consumer] | None = consumers_for(services)
    except MissingSecret:
        consumers = None  # every push is refused, saying why
    router = APIRouter(tags=["queues"])
    for topic in TOPICS:
        router.add_api_route(route_of(topic), _endpoint(topic, consumers), methods=["POST"],
                             name=f"queues:push:{topic}",
                             summary=f"push a signed {topic} message to its consumer")
    return router


def _endpoint(topic: str, consumers: dict[str, Consumer] | None) -> Any:
    async def push(request: Request) -> JSONResponse:
        if consumers is None:
            raise UpstreamUnavailable("SLUICE_QUEUE_SIGNING_SECRET is not set: the consumers "
                                      "refuse every message")
        raw = await request.body()
        if len(raw) > MAX_MESSAGE_BYTES:
            raise RequestError(f"a message is at most {MAX_MESSAGE_BYTES} bytes", field="body")
        given = request.headers.get("x-message-id") or ""
        message_id = given if _MESSAGE_ID.fullmatch(given) else f"push-{uuid.uuid4()}"
        decision = await run_in_threadpool(consumers[topic].deliver_local,
                                           raw.decode("utf-8", "replace"), message_id)
        return JSONResponse({"topic": topic, "messageId": message_id,
                             "outcome": decision.outcome.value, "reason": decision.reason},
                            status_code=STATUS_OF[decision.outcome])

    return push
