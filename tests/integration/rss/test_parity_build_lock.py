"""The cross-instance build lock as the reference documents describe it: two instances
(each its own ``Services``, database connection and Redis client) given ``rss.ingest``
messages for the same build key at the same moment make one build between them. Run
through each instance's ``rss.ingest`` consumer, with Redis (``SET NX PX``) and without it
(the database lease)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sluice.core.services import Services
from sluice.queues.consumer import Consumer, MessageOutcome
from sluice.queues.publish import Publisher
from sluice.queues.runtime import handler_for
from sluice.rss.store import RssStore
from sluice.store.flags import FlagStore
from tests.providers.feeds import FeedServer
from tests.rss_support import feed_services

SECRET = "queue-secret-for-tests-0123456789"


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


@pytest.mark.parametrize("lock", ["redis", "database"])
def test_two_instances_given_the_same_key_at_once_build_it_once(
        lock: str, request: pytest.FixtureRequest, pg_url: str,
        make_services: Callable[..., Services], feeds: FeedServer) -> None:
    env: dict[str, str] = {"SLUICE_QUEUE_SIGNING_SECRET": SECRET}
    if lock == "redis":
        prefix: str = request.getfixturevalue("redis_prefix")
        env |= {"SLUICE_REDIS_URL": request.getfixturevalue("redis_server"),
                "SLUICE_REDIS_KEY_PREFIX": prefix}
    instances = [feed_services(make_services, pg_url, **env) for _ in range(2)]
    assert all(svc.settings.redis_configured is (lock == "redis") for svc in instances)
    first = instances[0]
    store = RssStore(first.db)
    sources = tuple(store.add_source(feeds.add_rss(f"/set/{n}", items=3)).id for n in range(3))
    for name in ("a", "b"):
        store.put_scope(name, f"tenant-{name}", sources, "en", True)
    FlagStore(first.state).set("rssQueuePipeline", True)
    # a build takes half a second: the second instance arrives while the first still builds
    feeds.on_request["/set/0"] = lambda: time.sleep(0.5)
    key = store.scope("a").build_key
    publisher = Publisher(first.settings)
    bodies = [json.dumps(publisher.build("rss.ingest", {"sourceId": "build", "buildKey": key}))
              for _ in instances]
    barrier = threading.Barrier(len(instances))
    outcomes: list[Any] = []

    def consume(svc: Services, body: str, message_id: str) -> None:
        consumer = Consumer("rss.ingest", handler_for("rss.ingest", svc), svc, registry=None)
        barrier.wait()
        outcomes.append(consumer.deliver_local(body, message_id).outcome)

    threads = [threading.Thread(target=consume, args=(svc, body, f"m-{n}"))
               for n, (svc, body) in enumerate(zip(instances, bodies, strict=True))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert outcomes == [MessageOutcome.DONE] * 2
    assert dict(feeds.hits) == {f"/set/{n}": 1 for n in range(3)}, "one build between them"
    assert all(store.scope(name).last_refreshed_at is not None for name in ("a", "b"))
