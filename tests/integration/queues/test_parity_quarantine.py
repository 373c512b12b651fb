"""A rejected message whose quarantine cannot be written (its SQLite store locked past the
busy timeout by another connection), through the ``rss.ingest`` consumer on moto's SQS: it
is not lost and not acknowledged bare; it waits on the queue as a delayed copy of itself."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

import pytest

from sluice.core.services import Services
from sluice.queues.deadletters import Quarantine
from sluice.queues.runtime import consumers_for
from sluice.queues.signing import Signer
from sluice.store import db as db_module
from tests.integration.queues.test_consumer_sqs import _delayed
from tests.sqs_helpers import bodies, create_queues, new_prefix, poll, sqs_client

SECRET = "queue-secret-for-tests-0123456789"
FORGER = "another-secret-0123456789abcdef"


@pytest.mark.aws
def test_a_rejection_whose_quarantine_is_locked_waits_as_a_delayed_copy(
        aws_env: dict[str, str], sqlite_url: str, make_services: Callable[..., Services],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db_module, "BUSY_TIMEOUT_S", 1.0)  # a held lock is an outage in 1 s
    services = make_services(sqlite_url, SLUICE_QUEUE_MODE="sqs",
                             SLUICE_QUEUE_SIGNING_SECRET=SECRET, SLUICE_QUEUE_PREFIX=new_prefix())
    urls = create_queues(services.settings.queue_prefix)
    url = urls["rss.ingest"]
    forged = Signer([FORGER]).sign({"topic": "rss.ingest", "batchId": "forged",
                                    "sourceId": "all-sources", "feedUrl": "",
                                    "publishedAt": "2026-03-01T12:00:00.000Z"})
    sqs_client().send_message(QueueUrl=url, MessageBody=json.dumps(forged))
    consumer = consumers_for(services, registry=None)["rss.ingest"]
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the store
    try:
        polled = poll(url, consumer.lambda_handler)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert polled.failed_ids == [] and len(polled.deleted_ids) == 1
    assert _delayed(url) == 1, "the rejection waits as a delayed copy"
    assert Quarantine(services.db).list(10) == [] and bodies(urls["rss.ingest-dlq"]) == []
