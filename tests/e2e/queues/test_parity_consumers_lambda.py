"""The ``rss.ingest`` consumer function as the reference documents describe it, called with
the SQS event from tests/events and its real refresh against a local feed publisher: it
reads the pipeline flag itself when the message arrives, does nothing while it is off, and
refreshes the global catalog (every global feed, no tenant scope) while it is on."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from sluice.core.services import Services
from sluice.queues.signing import Signer
from sluice.rss.catalog import peek, peek_scope
from sluice.rss.store import GLOBAL_KEY, RssStore
from sluice.store.flags import FlagStore
from tests.conftest import BASE_ENV, load_event
from tests.e2e.queues.test_consumers_lambda import SECRET, consumers_module
from tests.providers.feeds import FeedServer
from tests.rss_support import FEED_ENV


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


def test_the_ingest_function_reads_the_flag_when_the_message_arrives(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch, feeds: FeedServer,
        make_services: Callable[..., Services]) -> None:
    env = {**BASE_ENV, **FEED_ENV, "SLUICE_DATABASE_URL": sqlite_url,
           "SLUICE_QUEUE_SIGNING_SECRET": SECRET}
    services = make_services(sqlite_url, **FEED_ENV)
    store = RssStore(services.db)
    for n in range(2):
        store.add_source(feeds.add_rss(f"/global/{n}", items=2), f"Wire {n}", True)
    store.put_scope("a", "tenant-a", (store.add_source(feeds.add_rss("/a", items=2)).id,),
                    "en", True)
    module = consumers_module(monkeypatch, env)
    event = load_event("sqs_rss_ingest")
    assert module.handler(event, None) == {"batchItemFailures": []}
    assert dict(feeds.hits) == {} and peek(services, GLOBAL_KEY) is None, "off: no work"

    FlagStore(services.state).set("rssQueuePipeline", True)
    record = event["Records"][0]
    message = json.loads(record["body"])
    del message["signature"]
    record["body"] = json.dumps(Signer([SECRET]).sign({**message, "batchId": "after-the-flip"}))
    record["messageId"] = "after-the-flip"
    assert module.handler(event, None) == {"batchItemFailures": []}
    assert dict(feeds.hits) == {"/global/0": 1, "/global/1": 1}
    build = peek(services, GLOBAL_KEY)
    assert build is not None and len(build.stories) == 4
    assert peek_scope(services, "a") is None, "the global message builds no tenant scope"
