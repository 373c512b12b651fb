"""The push-queue topics: one table, from which the consumers and their wiring are built.

Each topic names the factory of its handler (``"module:function"``, called with the
services, returning the handler), or ``None`` when the topic is reserved: nothing may
publish to it and its consumer fails loud, so a stray message retries and dead-letters
instead of vanishing. ``python -m infra.generate`` writes the queues, DLQs, alarms,
roles and consumer functions of every topic from this table.
"""

from __future__ import annotations

from typing import NamedTuple

from sluice.core.errors import Conflict, NotFound
from sluice.core.settings import Settings

MAX_ATTEMPTS = 5
VISIBILITY_TIMEOUT_S = 300


class Topic(NamedTuple):
    name: str
    target: str | None = None  # "module:function(services) -> Handler"; None: reserved
    batch_size: int = 10
    max_concurrency: int | None = None  # concurrent consumers (None: Lambda's default)
    # The setting that sizes max_concurrency at deploy time (its default is max_concurrency)
    concurrency_var: str | None = None
    # The handler's effect is keyed so that running it again applies nothing twice: its
    # completions are then written once per batch instead of once per record.
    idempotent: bool = False

    @property
    def reserved(self) -> bool:
        return self.target is None

    @property
    def words(self) -> list[str]:
        return self.name.replace("-", ".").split(".")


TOPICS: dict[str, Topic] = {
    topic.name: topic
    for topic in (
        # each build writes to Postgres and fetches feeds: cap the fan-out (a setting, read
        # when the template is deployed). A repeated build is shared, not redone, and the
        # alerts it raises are enqueued under their idempotency keys, so a batch's
        # completions are written once.
        Topic("rss.ingest", "sluice.queues.handlers:ingest_handler",
              max_concurrency=Settings._field_defaults["rss_ingest_concurrency"],
              concurrency_var="SLUICE_RSS_INGEST_CONCURRENCY", idempotent=True),
        Topic("rss.enrich"),
        Topic("rss.cluster"),
        Topic("rss.synthesize"),
    )
}


class UnknownTopic(NotFound):
    """No such push-queue topic."""

    code = "unknown_topic"


class ReservedTopic(Conflict):
    """This topic is reserved: its consumer is not implemented, so nothing may publish to it."""

    code = "reserved_topic"


def get_topic(name: str) -> Topic:
    try:
        return TOPICS[name]
    except KeyError:
        raise UnknownTopic(f"unknown topic {name!r}; known: {', '.join(TOPICS)}",
                           field="topic") from None


def check_topic(name: str, *, publishing: bool = False) -> str:
    topic = get_topic(name)
    if publishing and topic.reserved:
        raise ReservedTopic(f"{name} consumer is not implemented; do not enable a producer "
                            "for this topic", field="topic")
    return name


def queue_name(prefix: str, topic: str) -> str:
    return prefix + topic.replace(".", "-")


def dlq_name(prefix: str, topic: str) -> str:
    return queue_name(prefix, topic) + "-dlq"
