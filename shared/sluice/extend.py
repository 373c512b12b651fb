"""``sluice.extend``: what an app's extension module declares its own work with.

An app lists its cron jobs, push-queue topics and delivery channels in one module of its
own package, as ``JOBS``, ``TOPICS`` and ``CHANNELS``, chooses Sluice's packs there with
``PACKS`` (``sluice.core.packs``), and names that module by an entry point in the group
``sluice.extensions`` or in ``SLUICE_APP`` (``sluice.core.extensions``; docs/extending.md).
Sluice's own packs (``sluice.packs``) declare their work with these same names.

Keep that module to declarations: every Sluice function imports it at cold start. So the
names here load on first use, each from the module that defines it: declaring a ``Job``,
``Topic`` or ``Channel`` loads neither the drains, the consumer nor the HTTP client, while
each job's drain, each topic's handler factory and each channel's adapter are imported
only where they run (``target="module:function"``, or a ``build`` that imports).

The names in ``__all__`` are the stable extension API (docs/api.md), as ``sluice``'s own
are its app API; tests/unit/test_exported_members.py pins both.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.core.errors import RequestError
    from sluice.core.services import Services
    from sluice.core.settings import Settings
    from sluice.core.surfaces import SURFACE_ROLES, Surface
    from sluice.delivery.adapter import (
        NO_PROGRESS,
        Channel,
        ChannelAdapter,
        Outbound,
        Progress,
    )
    from sluice.delivery.channels.base import message_of, refused, transport_error
    from sluice.delivery.classify import (
        OutcomeUnknown,
        PermanentDeliveryError,
        TransientDeliveryError,
    )
    from sluice.delivery.payload import Message
    from sluice.delivery.retry import Retrier
    from sluice.delivery.store import DeliveryEntry
    from sluice.egress.client import Answer, Egress
    from sluice.egress.errors import EgressError
    from sluice.jobs.registry import Deadline, Job, JobContext, Param, Result
    from sluice.queues.consumer import Handler, InboundMessage
    from sluice.queues.topics import MessageField, Topic

# Each name and the module that defines it.
_SOURCES: dict[str, str] = {
    "Answer": "sluice.egress.client",
    "Channel": "sluice.delivery.adapter",
    "ChannelAdapter": "sluice.delivery.adapter",
    "Deadline": "sluice.jobs.registry",
    "DeliveryEntry": "sluice.delivery.store",
    "Egress": "sluice.egress.client",
    "EgressError": "sluice.egress.errors",
    "Handler": "sluice.queues.consumer",
    "InboundMessage": "sluice.queues.consumer",
    "Job": "sluice.jobs.registry",
    "JobContext": "sluice.jobs.registry",
    "Message": "sluice.delivery.payload",
    "MessageField": "sluice.queues.topics",
    "NO_PROGRESS": "sluice.delivery.adapter",
    "Outbound": "sluice.delivery.adapter",
    "OutcomeUnknown": "sluice.delivery.classify",
    "Param": "sluice.jobs.registry",
    "PermanentDeliveryError": "sluice.delivery.classify",
    "Progress": "sluice.delivery.adapter",
    "RequestError": "sluice.core.errors",
    "Result": "sluice.jobs.registry",
    "Retrier": "sluice.delivery.retry",
    "SURFACE_ROLES": "sluice.core.surfaces",
    "Services": "sluice.core.services",
    "Settings": "sluice.core.settings",
    "Surface": "sluice.core.surfaces",
    "Topic": "sluice.queues.topics",
    "TransientDeliveryError": "sluice.delivery.classify",
    "message_of": "sluice.delivery.channels.base",
    "refused": "sluice.delivery.channels.base",
    "transport_error": "sluice.delivery.channels.base",
}

__all__ = [
    "NO_PROGRESS",
    "SURFACE_ROLES",
    "Answer",
    "Channel",
    "ChannelAdapter",
    "Deadline",
    "DeliveryEntry",
    "Egress",
    "EgressError",
    "Handler",
    "InboundMessage",
    "Job",
    "JobContext",
    "Message",
    "MessageField",
    "Outbound",
    "OutcomeUnknown",
    "Param",
    "PermanentDeliveryError",
    "Progress",
    "RequestError",
    "Result",
    "Retrier",
    "Services",
    "Settings",
    "Surface",
    "Topic",
    "TransientDeliveryError",
    "message_of",
    "refused",
    "transport_error",
]


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'sluice.extend' has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
