"""The door: what each app-facing operation accepts, as one table every entry point reads.

``sluice.enqueue_delivery``, ``POST /api/admin/delivery/entries`` and ``sluice delivery
enqueue`` take a delivery through ``admit("enqueue_delivery", ...)``; the erasure request
and the publish do the same with their own rows. So the Python API, the HTTP API and the
command line refuse the same value with the same ``RequestError``, naming the field by
its one name: the contract (JSON) name, which ``FIELDS_OF`` maps to each door's spelling
(the Python keyword, the command line's argument) for the docs and the tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from sluice.core.errors import RequestError
from sluice.core.settings import Settings
from sluice.core.validate import check_depth, check_optional_identifier, refuse
from sluice.delivery.channels import channels, check_recipient, webhook_guard
from sluice.delivery.payload import parse
from sluice.egress import DestinationRefused
from sluice.erasure.requests import check_grace_days, check_optional_id, check_subject
from sluice.queues.topics import check_topic

# check(value, the fields checked before it, settings) -> the value to use
Check = Callable[[Any, Mapping[str, Any], Settings], Any]
MAX_FIELDS_BYTES = 262_144  # SQS's limit of a message body: a larger one is never sent


class Field(NamedTuple):
    name: str  # the contract name: the HTTP body's key, and what every refusal names
    python: str  # the keyword of the ``sluice.*`` call
    cli: str  # the command line's argument
    check: Check
    required: bool = False
    in_body: bool = True  # False: the HTTP API takes it from the request (the caller's identity)


def _channel(value: Any, done: Mapping[str, Any], settings: Settings) -> str:
    if value not in channels():
        raise RequestError(f"channel must be one of {', '.join(channels())}, got {value!r}",
                           field="channel")
    return str(value)


def _recipient(value: Any, done: Mapping[str, Any], settings: Settings) -> str:
    channel = done["channel"]
    recipient = check_recipient(channel, value, field="recipient")
    if channel == "webhook":  # what the sender would refuse, refused now (no DNS)
        try:
            webhook_guard(settings.webhook_allow_hosts).check_url(recipient)
        except DestinationRefused as exc:
            raise DestinationRefused(f"recipient {exc.message}", field="recipient") from None
    return recipient


def _payload(value: Any, done: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    parse(done["channel"], value)
    result: dict[str, Any] = value
    return result


def _identifier(name: str) -> Check:
    return lambda value, done, settings: check_optional_identifier(value, field=name)


def _subject(value: Any, done: Mapping[str, Any], settings: Settings) -> str:
    return check_subject(value, "subjectUserId")


def _tenant(value: Any, done: Mapping[str, Any], settings: Settings) -> str | None:
    return check_optional_id(value, "tenantId")


def _grace(value: Any, done: Mapping[str, Any], settings: Settings) -> int:
    return check_grace_days(value, settings.erasure_grace_days)


def _requested_by(value: Any, done: Mapping[str, Any], settings: Settings) -> str:
    return check_subject(value, "requestedBy")


def _topic(value: Any, done: Mapping[str, Any], settings: Settings) -> str:
    if not isinstance(value, str) or not value:
        raise refuse("topic", "must be a non-empty string")
    return check_topic(value, publishing=True)


def _fields(value: Any, done: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise refuse("fields", "must be a JSON object")
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise refuse("fields", f"must hold JSON values only: {exc}") from None
    except RecursionError:
        raise refuse("fields", "is nested too deeply") from None
    check_depth(text, field="fields")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FIELDS_BYTES:
        raise refuse("fields", f"must be at most {MAX_FIELDS_BYTES} bytes as JSON (SQS's "
                               "limit of a whole message)")
    return dict(value)


OPERATIONS: dict[str, tuple[Field, ...]] = {
    "enqueue_delivery": (
        Field("channel", "channel", "CHANNEL", _channel, required=True),
        Field("recipient", "recipient", "RECIPIENT", _recipient, required=True),
        Field("payload", "payload", "--text / --payload", _payload, required=True),
        Field("idempotencyKey", "idempotency_key", "--key", _identifier("idempotencyKey")),
        Field("subjectUserId", "subject_user_id", "--user", _identifier("subjectUserId")),
    ),
    "request_erasure": (
        Field("subjectUserId", "subject", "SUBJECT", _subject, required=True),
        Field("tenantId", "tenant_id", "--tenant", _tenant),
        Field("graceDays", "grace_days", "--grace-days", _grace),
        Field("requestedBy", "requested_by", "--by", _requested_by, required=True,
              in_body=False),
    ),
    "publish": (
        Field("topic", "topic", "TOPIC", _topic, required=True),
        Field("fields", "fields", "stdin", _fields),
    ),
}


def fields_of(operation: str) -> tuple[Field, ...]:
    return OPERATIONS[operation]


def body_fields(operation: str) -> tuple[str, ...]:
    """The keys an HTTP body of ``operation`` may hold."""
    return tuple(f.name for f in OPERATIONS[operation] if f.in_body)


def admit(operation: str, values: Mapping[str, Any], settings: Settings, *,
          body: bool = False, caller: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``values`` (by contract name) checked field by field, in the table's order: the
    values to use, or the first ``RequestError``, naming its field. ``body``: ``values`` is
    an HTTP body, which may hold only the table's body fields; ``caller``: the fields the
    HTTP API takes from the request itself (who asks), checked like the others."""
    table = OPERATIONS[operation]
    accepted = body_fields(operation) if body else tuple(f.name for f in table)
    unknown = sorted(set(values) - set(accepted))
    if unknown:
        raise RequestError(f"unknown field(s): {', '.join(unknown)}; accepted: "
                           f"{', '.join(accepted)}", field=unknown[0])
    given = {**values, **(caller or {})}
    checked: dict[str, Any] = {}
    for item in table:
        value = given.get(item.name)
        if value is None and item.required:
            raise refuse(item.name, "is required")
        checked[item.name] = item.check(value, checked, settings)
    return checked
