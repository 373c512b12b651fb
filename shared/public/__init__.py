"""``sluice``: what a Python web app calls to feed Sluice.

Installed as the import name ``sluice`` (the code lives in ``shared/public``). The
names in ``__all__`` are the stable API: they keep their meaning and signatures
within a major version. Everything else under ``shared`` is Sluice's own and may
change. docs/integration.md shows each call in context.
"""

from __future__ import annotations

from shared.billing.usage import UsageEntry
from shared.core.errors import (
    ConfigurationError,
    PermanentStoreError,
    RequestError,
    SluiceError,
    TransientStoreError,
)
from shared.core.services import Services
from shared.core.settings import Settings
from shared.delivery.store import DeliveryEntry, DeliveryStatus
from shared.erasure.requests import ErasureRequest
from shared.public.app import (
    connect,
    enqueue_delivery,
    publish,
    record_usage,
    request_erasure,
)
from shared.queues.publish import Published
from shared.queues.signing import Signer, canonical

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
    "enqueue_delivery",
    "publish",
    "record_usage",
    "request_erasure",
]
