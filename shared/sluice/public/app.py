"""The calls an app makes, each one line over the capability that does the work.

They take the ``Services`` from :func:`connect` (build it once per process, at module
scope in a Lambda) and raise from the one error tree: ``RequestError`` for input Sluice
refuses (naming the field), ``ConfigurationError`` for a missing setting,
``TransientStoreError`` when the store is unreachable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluice.billing import usage
from sluice.billing.usage import Recorded, UsageEntry
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.delivery.drain import check_enqueue
from sluice.delivery.store import DeliveryEntry, DeliveryStore
from sluice.erasure.requests import (
    ErasureRequest,
    ErasureStore,
    check_grace_days,
    check_optional_id,
    check_subject,
)
from sluice.queues.publish import Published
from sluice.queues.runtime import publisher_of


def connect(env: Mapping[str, str] | None = None) -> Services:
    """Sluice's dependencies from ``SLUICE_*`` settings (``env``, else the process's);
    a missing or invalid setting is a ``ConfigurationError`` naming the variable."""
    return Services.from_settings(Settings.from_env(env))


def publish(services: Services, topic: str, fields: Mapping[str, Any] | None = None
            ) -> Published:
    """Sign ``fields`` as a message on ``topic`` and send it: to SQS on AWS, to the
    in-process consumer locally. ``Published.dispatched`` says whether it went."""
    return publisher_of(services).publish(topic, fields)


def enqueue_delivery(services: Services, channel: str, recipient: str,
                     payload: dict[str, Any], *, idempotency_key: str | None = None,
                     subject_user_id: str | None = None) -> DeliveryEntry:
    """Store a message for delivery-drain to send (``pending``, due now). A second call with
    the same ``idempotency_key`` returns the first entry and stores nothing."""
    check_enqueue(channel, payload)
    entry, _created = DeliveryStore(services.db).enqueue(
        channel, recipient, payload, idempotency_key=idempotency_key,
        subject_user_id=subject_user_id)
    return entry


def record_usage(services: Services, entry: UsageEntry) -> Recorded:
    """One AI model call into the ledger (and its metering outbox row when billable):
    ``recorded``, ``duplicate``, ``erased``, or ``queued`` when Postgres was unreachable
    and the entry waits in the Redis retry queue for ledger-redrive."""
    return usage.record_usage(entry, db=services.db, redis=services.redis)


def request_erasure(services: Services, subject: str, *, requested_by: str,
                    tenant_id: str | None = None, grace_days: int | None = None
                    ) -> ErasureRequest:
    """Open an erasure request for ``subject`` (the app's user id), purged by erasure-purge
    when its grace window ends; the subject's open request if there is one already."""
    grace = check_grace_days(grace_days, services.settings.erasure_grace_days)
    request, _created = ErasureStore(services.db).create(
        check_subject(subject, "subject"), requested_by=requested_by, grace_days=grace,
        tenant_id=check_optional_id(tenant_id, "tenantId"))
    return request
