"""The push-queue topics: one table, from which the consumers and their wiring are built.

Sluice's core declares no topic: the rss pack declares ``rss.*`` (``sluice.packs.rss``)
and an app declares its own in its extension module (``sluice.core.extensions``); both are
merged in on first use. Each topic names the factory of its handler (``"module:function"``,
called with the services, returning the handler), or ``None`` when the topic is reserved:
nothing may publish to it and its consumer fails loud, so a stray message retries and
dead-letters instead of vanishing. ``sluice generate`` (``python -m infra.generate`` for
this repository) writes the queues, DLQs, alarms, roles and consumer functions of every
topic from this table.

A topic's messages are its own: it declares their fields (``MessageField``: required,
optional, or filled by a default when not given), whether other fields are taken too, and
how its ``idempotencyKey`` attribute is made (``key``: field names, a function of the
message, or by default the message's content hash; ``sluice.queues.keys``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, NamedTuple

from sluice.core.errors import ConfigurationError, Conflict, NotFound, RequestError
from sluice.core.extensions import Table

MAX_ATTEMPTS = 5
VISIBILITY_TIMEOUT_S = 300


class MessageField(NamedTuple):
    """One field of a topic's messages. Given a value (not None) when published, it carries
    that value; else its ``default`` (a value, or a function of the publish time), else it
    is refused when ``required`` and left out when not."""

    name: str
    required: bool = True
    default: Any = None

    def value(self, given: Any, now: datetime) -> Any:
        if given is not None:
            return given
        if callable(self.default):
            return self.default(now)
        return self.default


# How a topic's idempotencyKey attribute is made: field names (``<topic>:<v1>:<v2>``), or a
# function of the message; empty, the message's content hash (``sluice.queues.keys``).
KeyRule = tuple[str, ...] | Callable[[Mapping[str, Any]], str]
RESERVED_FIELDS = frozenset({"topic", "signature"})


class Topic(NamedTuple):
    name: str
    target: str | None = None  # "module:function(services) -> Handler"; None: reserved
    batch_size: int = 10
    max_concurrency: int | None = None  # concurrent consumers (None: Lambda's default)
    # The environment variable that sizes max_concurrency when the stack is deployed (its
    # default is max_concurrency)
    concurrency_var: str | None = None
    # The handler's effect is keyed so that running it again applies nothing twice: its
    # completions are then written once per batch instead of once per record.
    idempotent: bool = False
    # The fields of its messages, in order (a name alone is a required field).
    fields: tuple[MessageField | str, ...] = ()
    other_fields: bool = False  # fields it does not declare are taken too, after its own
    key: KeyRule = ()

    @property
    def reserved(self) -> bool:
        return self.target is None

    @property
    def words(self) -> list[str]:
        return self.name.replace("-", ".").split(".")

    @property
    def declared(self) -> tuple[MessageField, ...]:
        return tuple(MessageField(f) if isinstance(f, str) else f for f in self.fields)

    def compose(self, given: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        """A message's fields (without ``topic`` and ``signature``, which the publisher
        adds): the declared ones in their order, then the others as given, if it takes
        them. A missing required field or one it does not take is a ``RequestError``
        naming ``fields.<name>``."""
        out: dict[str, Any] = {}
        for field in self.declared:
            value = field.value(given.get(field.name), now)
            if value is not None:
                out[field.name] = value
            elif field.required:
                raise RequestError(f"fields.{field.name} is required by topic {self.name}",
                                   field=f"fields.{field.name}")
        names = {field.name for field in self.declared} | RESERVED_FIELDS
        for name, value in given.items():
            if name in names:
                continue
            if not self.other_fields:
                raise RequestError(
                    f"topic {self.name} has no field {name!r}; its fields: "
                    f"{', '.join(f.name for f in self.declared) or 'none'}",
                    field=f"fields.{name}")
            out[name] = value
        return out


# area.name: lower-case words; the queue is the stage prefix plus the name with '-' for
# '.', and SQS names stop at 80 characters (with "-dlq" and a prefix of up to 24).
NAME = re.compile(r"[a-z][a-z0-9]*(\.[a-z][a-z0-9]*)+")
MAX_NAME = 48
TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


ENV_VAR = re.compile(r"[A-Z][A-Z0-9_]{0,63}")


def check_topic_entry(item: object, source: str) -> Topic:
    """A declared topic, well formed: ``area.name``, a ``module:function`` handler factory
    (or none: reserved), a batch SQS takes, a bounded concurrency, and fields and a key
    that name each field once."""
    if not isinstance(item, Topic):
        raise ConfigurationError(f"{source}: TOPICS holds {item!r}, not a sluice.extend.Topic")
    where = f"{source}: topic {item.name!r}"
    if not (isinstance(item.name, str) and NAME.fullmatch(item.name)
            and len(item.name) <= MAX_NAME):
        raise ConfigurationError(f"{where}: a name is lower-case words joined by '.' "
                                 f"(area.name, at most {MAX_NAME} characters)")
    if item.target is not None and not TARGET.fullmatch(item.target):
        raise ConfigurationError(f"{where}: target must be 'module:function' (the factory "
                                 "of its handler), or None for a reserved topic")
    if not 1 <= item.batch_size <= 10:
        raise ConfigurationError(f"{where}: batch_size must be 1 to 10")
    if item.max_concurrency is not None and not 2 <= item.max_concurrency <= 1000:
        raise ConfigurationError(f"{where}: max_concurrency must be 2 to 1000 (SQS's bounds)")
    if item.concurrency_var is not None and not (
            ENV_VAR.fullmatch(item.concurrency_var) and item.max_concurrency is not None):
        raise ConfigurationError(f"{where}: concurrency_var must be an environment variable "
                                 "name (A-Z, 0-9, _), with max_concurrency its default")
    if not isinstance(item.idempotent, bool) or not isinstance(item.other_fields, bool):
        raise ConfigurationError(f"{where}: idempotent and other_fields must be True or False")
    return item._replace(fields=_check_fields(item, where))


def _check_fields(item: Topic, where: str) -> tuple[MessageField, ...]:
    if not isinstance(item.fields, tuple | list):
        raise ConfigurationError(f"{where}: fields must be a tuple of field names or "
                                 "sluice.extend.MessageField")
    fields = [MessageField(f) if isinstance(f, str) else f for f in item.fields]
    for field in fields:
        if not (isinstance(field, MessageField) and isinstance(field.name, str)
                and FIELD.fullmatch(field.name) and field.name not in RESERVED_FIELDS):
            raise ConfigurationError(f"{where}: a field is a name (letters, digits, _ and -; "
                                     f"not topic or signature), not {field!r}")
    names = [field.name for field in fields]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{where}: fields names a field twice")
    if callable(item.key):
        return tuple(fields)
    sure = {f.name for f in fields if f.required or f.default is not None}
    if not isinstance(item.key, tuple | list) or not set(item.key) <= sure \
            or len(set(item.key)) != len(item.key):
        raise ConfigurationError(f"{where}: key must be a function of the message, or names "
                                 "of its fields that every message has (required, or with "
                                 "a default)")
    return tuple(fields)


TOPICS: Table[Topic] = Table("TOPICS", (), lambda topic: topic.name, check_topic_entry)


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
