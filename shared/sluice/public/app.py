"""The calls an app makes, each one line over the capability that does the work.

They take the ``Services`` from :func:`connect` (build it once per process, at module
scope in a Lambda) and raise from the one error tree: ``RequestError`` for input Sluice
refuses (naming the field, exactly as the HTTP API and the command line do: the checks
are the door's table, ``sluice.ops.door``), ``ConfigurationError`` for a missing setting or
database, ``TransientStoreError`` when a store did not answer within
``SLUICE_REQUEST_PATH_TIMEOUT_SECONDS``: an app's request never waits on an outage longer.
A call whose pack the deployment leaves out (``PACKS``) is a ``ConfigurationError``
(``PackOff``) naming the pack: nothing would ever drain what it stored.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sluice.billing import usage
from sluice.billing.usage import Recorded, UsageEntry
from sluice.core.errors import ConfigurationError, RequestError
from sluice.core.extensions import require_pack
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.delivery.store import DeliveryEntry, DeliveryStore, NewEntry
from sluice.erasure.requests import ErasureRequest, ErasureStore
from sluice.ops.door import admit
from sluice.queues.publish import Published
from sluice.queues.runtime import publisher_of
from sluice.store.db import require_existing, sqlite_path
from sluice.store.deadline import bounded_by


def connect(env: Mapping[str, str] | None = None) -> Services:
    """Sluice's dependencies from ``SLUICE_*`` settings (``env``, else the process's);
    a missing or invalid setting is a ``ConfigurationError`` naming the variable. It
    never creates a database: an SQLite file that does not exist, or one not migrated,
    is a ``ConfigurationError`` saying to run ``sluice migrate``."""
    settings = Settings.from_env(env)
    require_existing(settings.database_url)
    path = sqlite_path(settings.database_url)
    if path is not None:  # a local file: checked now, read only (Postgres: no round trip)
        from sluice.store.migrate import unapplied

        waiting = unapplied(path)
        if waiting:
            raise ConfigurationError(
                f"SLUICE_DATABASE_URL: the SQLite database lacks {len(waiting)} migration(s) "
                f"(first {waiting[0].version} {waiting[0].name}); run `sluice migrate`")
    services = Services.from_settings(settings)
    return services


@contextmanager
def request_path(services: Services) -> Iterator[None]:
    """Every store call inside ends within the request path's bound, together."""
    ends = time.monotonic() + services.settings.request_path_timeout_s
    with bounded_by(lambda: ends - time.monotonic()):
        yield


def publish(services: Services, topic: str, fields: Mapping[str, Any] | None = None
            ) -> Published:
    """Sign ``fields`` as a message on ``topic`` and send it: to SQS on AWS, to the
    in-process consumer locally. ``Published.dispatched`` says whether it went."""
    checked = admit("publish", {"topic": topic, "fields": fields}, services.settings)
    with request_path(services):
        return publisher_of(services, request_path=True).publish(checked["topic"],
                                                                 checked["fields"])


def enqueue_delivery(services: Services, channel: str, recipient: str,
                     payload: dict[str, Any], *, idempotency_key: str | None = None,
                     subject_user_id: str | None = None) -> DeliveryEntry:
    """Store a message for delivery-drain to send (``pending``, due now). A second call with
    the same ``idempotency_key`` returns the first entry and stores nothing."""
    require_pack("delivery", "sluice.enqueue_delivery")
    checked = admit("enqueue_delivery", {
        "channel": channel, "recipient": recipient, "payload": payload,
        "idempotencyKey": idempotency_key, "subjectUserId": subject_user_id},
        services.settings)
    with request_path(services):
        entry, _created = DeliveryStore(services.db).enqueue(
            checked["channel"], checked["recipient"], checked["payload"],
            idempotency_key=checked["idempotencyKey"],
            subject_user_id=checked["subjectUserId"])
    return entry


def enqueue_deliveries(services: Services, items: Sequence[Mapping[str, Any]]
                       ) -> list[DeliveryEntry]:
    """Store many messages for delivery-drain in one commit, in order: each item holds
    ``enqueue_delivery``'s arguments by name (``channel``, ``recipient``, ``payload``,
    ``idempotency_key``, ``subject_user_id``) and is checked exactly as one call checks
    them. The first item refused is a ``RequestError`` naming its index and field
    (``items[3].recipient``), and nothing is stored. An item whose ``idempotency_key`` is
    stored already answers that entry and stores nothing."""
    require_pack("delivery", "sluice.enqueue_deliveries")
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
        raise RequestError("items must be a list of deliveries", field="items")
    if len(items) > MAX_ENQUEUE:
        raise RequestError(f"items must be at most {MAX_ENQUEUE} deliveries, got {len(items)}",
                           field="items")
    new: list[NewEntry] = []
    for n, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise RequestError(f"items[{n}] must be a mapping of enqueue_delivery's "
                               "arguments", field=f"items[{n}]")
        unknown = sorted(set(item) - set(_ENQUEUE_ARGS))
        if unknown:
            raise RequestError(f"items[{n}]: unknown argument(s): {', '.join(unknown)}; "
                               f"accepted: {', '.join(_ENQUEUE_ARGS)}",
                               field=f"items[{n}].{unknown[0]}")
        try:
            checked = admit("enqueue_delivery", {
                contract: item.get(argument) for argument, contract in _ENQUEUE_ARGS.items()},
                services.settings)
        except RequestError as exc:
            field = exc.context.get("field")
            raise RequestError(f"items[{n}]: {exc.message}",
                               **{**exc.context, "field": f"items[{n}].{field}"}) from exc
        new.append(NewEntry(checked["channel"], checked["recipient"], checked["payload"],
                            checked["idempotencyKey"], checked["subjectUserId"]))
    with request_path(services):
        stored = DeliveryStore(services.db).enqueue_many(new)
    return [entry for entry, _created in stored]


# enqueue_delivery's arguments, by their Python names, and their contract names (the door's)
_ENQUEUE_ARGS = {"channel": "channel", "recipient": "recipient", "payload": "payload",
                 "idempotency_key": "idempotencyKey", "subject_user_id": "subjectUserId"}
MAX_ENQUEUE = 1000  # items of one enqueue_deliveries call: one transaction, bounded


def record_usage(services: Services, entry: UsageEntry) -> Recorded:
    """One AI model call into the ledger (and its metering outbox row when billable):
    ``recorded``, ``duplicate``, ``erased``, or ``queued`` when Postgres did not answer
    and the entry waits in the Redis retry queue for ledger-redrive."""
    require_pack("ledger", "sluice.record_usage")
    with request_path(services):
        return usage.record_usage(entry, db=services.db, redis=services.redis)


def request_erasure(services: Services, subject: str, *, requested_by: str,
                    tenant_id: str | None = None, grace_days: int | None = None
                    ) -> ErasureRequest:
    """Open an erasure request for ``subject`` (the app's user id), purged by erasure-purge
    when its grace window ends; the subject's open request if there is one already."""
    require_pack("erasure", "sluice.request_erasure")
    checked = admit("request_erasure", {
        "subjectUserId": subject, "tenantId": tenant_id, "graceDays": grace_days,
        "requestedBy": requested_by}, services.settings)
    with request_path(services):
        request, _created = ErasureStore(services.db).create(
            checked["subjectUserId"], requested_by=checked["requestedBy"],
            grace_days=checked["graceDays"], tenant_id=checked["tenantId"])
    return request
