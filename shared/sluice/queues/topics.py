"""The push-queue topics: one table, from which the consumers and their wiring are built.

Sluice's own topics are below; an app's are declared in its extension module
(``sluice.core.extensions``) and merged in on first use. Each topic names the factory of its handler (``"module:function"``, called with the
services, returning the handler), or ``None`` when the topic is reserved: nothing may
publish to it and its consumer fails loud, so a stray message retries and dead-letters
instead of vanishing. ``sluice generate`` (``python -m infra.generate`` for this
repository) writes the queues, DLQs, alarms, roles and consumer functions of every topic
from this table.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from sluice.core.errors import ConfigurationError, Conflict, NotFound
from sluice.core.extensions import Table
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


SLUICE_TOPICS: tuple[Topic, ...] = (
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

# area.name: lower-case words; the queue is the stage prefix plus the name with '-' for
# '.', and SQS names stop at 80 characters (with "-dlq" and a prefix of up to 24).
NAME = re.compile(r"[a-z][a-z0-9]*(\.[a-z][a-z0-9]*)+")
MAX_NAME = 48
TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def check_topic_entry(item: object, source: str) -> Topic:
    """A declared topic, well formed: ``area.name``, a ``module:function`` handler factory
    (an app's topic is never reserved), a batch SQS takes and a bounded concurrency."""
    if not isinstance(item, Topic):
        raise ConfigurationError(f"{source}: TOPICS holds {item!r}, not a sluice.extend.Topic")
    where = f"{source}: topic {item.name!r}"
    if not (isinstance(item.name, str) and NAME.fullmatch(item.name)
            and len(item.name) <= MAX_NAME):
        raise ConfigurationError(f"{where}: a name is lower-case words joined by '.' "
                                 f"(area.name, at most {MAX_NAME} characters)")
    if item.target is None or not TARGET.fullmatch(item.target):
        raise ConfigurationError(f"{where}: target must be 'module:function' (the factory "
                                 "of its handler)")
    if not 1 <= item.batch_size <= 10:
        raise ConfigurationError(f"{where}: batch_size must be 1 to 10")
    if item.max_concurrency is not None and not 2 <= item.max_concurrency <= 1000:
        raise ConfigurationError(f"{where}: max_concurrency must be 2 to 1000 (SQS's bounds)")
    if item.concurrency_var is not None:
        raise ConfigurationError(f"{where}: concurrency_var is Sluice's own; set "
                                 "max_concurrency")
    if not isinstance(item.idempotent, bool):
        raise ConfigurationError(f"{where}: idempotent must be True or False")
    return item


TOPICS: Table[Topic] = Table("TOPICS", SLUICE_TOPICS, lambda topic: topic.name,
                             check_topic_entry)


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
