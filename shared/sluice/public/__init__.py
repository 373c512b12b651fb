"""``sluice``: what a Python web app calls to feed Sluice.

``import sluice`` reaches these names lazily (``sluice/__init__.py``), so a Lambda
handler importing ``sluice.queues`` does not load the app API. The names in ``__all__``
are the stable API: they keep their meaning and signatures within a major version.
Everything else under ``sluice`` is Sluice's own and may change. docs/integration.md shows each call in context.
"""

from __future__ import annotations

from sluice.billing.usage import UsageEntry
from sluice.core.errors import (
    ConfigurationError,
    PermanentStoreError,
    RequestError,
    SluiceError,
    TransientStoreError,
)
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.core.webhooks import verify_webhook
from sluice.delivery.store import DeliveryEntry, DeliveryStatus
from sluice.erasure.requests import ErasureRequest
from sluice.public.app import (
    connect,
    enqueue_deliveries,
    enqueue_delivery,
    publish,
    record_usage,
    request_erasure,
)
from sluice.queues.publish import Published
from sluice.queues.signing import Signer, canonical

__all__ = [
    "ConfigurationError",
    "DeliveryEntry",
    "DeliveryStatus",
    "ErasureRequest",
    "PermanentStoreError",
    "Published",
    "RequestError",
    "Services",
    "Settings",
    "Signer",
    "SluiceError",
    "TransientStoreError",
    "UsageEntry",
    "canonical",
    "connect",
    "enqueue_deliveries",
    "enqueue_delivery",
    "publish",
    "record_usage",
    "request_erasure",
    "verify_webhook",
]
