"""``sluice.extend``: what an app's extension module declares its own work with.

An app lists its cron jobs, push-queue topics and delivery channels in one module of its
own package, as ``JOBS``, ``TOPICS`` and ``CHANNELS``, and names that module by an entry
point in the group ``sluice.extensions`` or in ``SLUICE_APP`` (``sluice.core.extensions``;
docs/extending.md). Keep that module to declarations: every Sluice function imports it at
cold start, while each job's drain, each topic's handler factory and each channel's
adapter are imported only where they run (``target="module:function"``).

The names here are the stable extension API, as ``sluice``'s own names are its app API.
"""

from __future__ import annotations

from sluice.core.errors import RequestError
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.delivery.channels.base import (
    NO_PROGRESS,
    Channel,
    ChannelAdapter,
    Outbound,
    Progress,
    message_of,
    refused,
    transport_error,
)
from sluice.delivery.classify import OutcomeUnknown, PermanentDeliveryError, TransientDeliveryError
from sluice.delivery.retry import Retrier
from sluice.delivery.store import DeliveryEntry
from sluice.jobs.registry import Job, JobContext, Param, Result
from sluice.queues.consumer import Handler, InboundMessage
from sluice.queues.topics import Topic

__all__ = [
    "NO_PROGRESS",
    "Channel",
    "ChannelAdapter",
    "DeliveryEntry",
    "Handler",
    "InboundMessage",
    "Job",
    "JobContext",
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
    "Topic",
    "TransientDeliveryError",
    "message_of",
    "refused",
    "transport_error",
]
