"""Sluice: durable background work for serverless Python.

``import sluice`` gives the app's stable API (``sluice.connect``, ``sluice.publish``, ...;
docs/integration.md). The names load on first use from :mod:`sluice.public`, so a Lambda
handler that imports ``sluice.queues`` or ``sluice.jobs`` pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.public import (
        ConfigurationError,
        DeliveryEntry,
        DeliveryStatus,
        ErasureRequest,
        PermanentStoreError,
        Published,
        RequestError,
        Services,
        Settings,
        Signer,
        SluiceError,
        TransientStoreError,
        UsageEntry,
        canonical,
        connect,
        enqueue_deliveries,
        enqueue_delivery,
        publish,
        record_usage,
        request_erasure,
        verify_webhook,
    )

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


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module("sluice.public"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sluice' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
