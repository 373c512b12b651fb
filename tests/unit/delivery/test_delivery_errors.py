"""Delivery error classification (the whole cause graph) and the retry schedule as data."""

from __future__ import annotations

import pytest

from sluice.core.errors import SluiceError
from sluice.delivery.channels.base import refused
from sluice.delivery.classify import (
    MAX_DEPTH,
    CredentialsRefused,
    FatalDeliveryError,
    MissingAdapter,
    OutcomeUnknown,
    PermanentDeliveryError,
    TransientDeliveryError,
    classify,
    describe,
    is_gone,
    is_unknown,
    retry_after_s,
)
from sluice.delivery.store import DEFAULT_SCHEDULE, RetrySchedule
from sluice.egress.pacing import Pacing

PERMANENT_TEXTS = [
    "Bad Request: chat not found",
    "USER NOT FOUND",
    "Forbidden: bot was blocked by the user",
    "Forbidden: bot was kicked from the group chat",
    "Bad Request: chat_id is empty",
    "No conversation reference found for this user",
    "ambiguous message recipient",
    "Forbidden: user is deactivated",
    "Bad Request: message is too long",
    "Forbidden: bot can't initiate conversation with a user",
    "Forbidden: bot is not a member of the channel chat",
    "slack: channel_not_found",
    "slack: is_archived",
    "email: recipient address rejected: 550 user unknown",
    "Bad Request: not enough rights to send text messages to the chat",
    "Forbidden: insufficient permissions for this chat",
    "Forbidden: not enough permissions to post here",
]
TRANSIENT_TEXTS = [
    "Too Many Requests: retry after 3",
    "connection reset by peer",
    "webhook answered 503",
    "slack: internal_error",
    "telegram 401: Unauthorized",
    "",
]


@pytest.mark.parametrize("text", PERMANENT_TEXTS)
def test_permanent_patterns_match_case_insensitively(text: str) -> None:
    assert classify(text) == "permanent"
    assert classify(text.swapcase()) == "permanent"
    assert classify(RuntimeError(text)) == "permanent"


@pytest.mark.parametrize("text", TRANSIENT_TEXTS)
def test_anything_else_is_transient(text: str) -> None:
    assert classify(text) == "transient"
    assert classify(OSError(text)) == "transient"


def test_typed_errors_belong_to_the_one_tree() -> None:
    assert issubclass(PermanentDeliveryError, SluiceError)
    assert issubclass(MissingAdapter, SluiceError)
    assert not issubclass(MissingAdapter, PermanentDeliveryError), \
        "a missing adapter is configuration, never the entry's permanent failure"
    assert classify(PermanentDeliveryError("whatever the text")) == "permanent"
    assert classify(TransientDeliveryError("chat not found")) == "transient", \
        "an adapter's explicit 'later' wins over a pattern"


def _raise_from(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as caught:  # noqa: BLE001 - returning what was raised is the point
        return caught


def test_the_cause_chain_is_walked() -> None:
    wrapped = _raise_from(RuntimeError("send failed"), ValueError("Bad Request: chat not found"))
    assert classify(wrapped) == "permanent"


def test_implicit_context_is_walked_unless_suppressed() -> None:
    try:
        try:
            raise KeyError("bot was blocked")
        except KeyError:
            raise RuntimeError("while handling")  # the implicit context is the point
    except RuntimeError as exc:
        assert classify(exc) == "permanent"
        exc.__suppress_context__ = True
        assert classify(exc) == "transient"


def test_exception_groups_are_walked() -> None:
    group = ExceptionGroup("two sends", [OSError("timeout"),
                                         ValueError("Forbidden: bot was kicked")])
    assert classify(group) == "permanent"
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [OSError("reset")])])
    assert classify(nested) == "transient"


def test_a_cycle_ends() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert classify(a) == "transient"
    b.args = ("user is deactivated",)
    assert classify(a) == "permanent"


def _chain(depth: int, leaf: str) -> BaseException:
    node: BaseException = RuntimeError(leaf)
    for i in range(depth - 1):
        parent = RuntimeError(f"level {i}")
        parent.__cause__ = node
        node = parent
    return node


def test_a_chain_deeper_than_the_limit_is_transient() -> None:
    assert classify(_chain(MAX_DEPTH, "chat not found")) == "permanent"
    assert classify(_chain(MAX_DEPTH + 1, "chat not found")) == "transient"


def test_retry_after_is_found_in_the_graph() -> None:
    wrapped = _raise_from(RuntimeError("x"), TransientDeliveryError("429", retry_after_s=7))
    assert retry_after_s(wrapped) == 7
    assert retry_after_s(RuntimeError("x")) is None


def test_describe_names_the_root_cause() -> None:
    text = describe(_raise_from(TransientDeliveryError("webhook: ConnectError"),
                                ConnectionRefusedError("refused")))
    assert text == ("TransientDeliveryError: webhook: ConnectError "
                    "(caused by ConnectionRefusedError: refused)")


def test_the_schedule_is_data() -> None:
    assert DEFAULT_SCHEDULE.delays_s == (5.0, 25.0, 120.0, 600.0)
    assert DEFAULT_SCHEDULE.table() == [(1, 5.0), (2, 25.0), (3, 120.0), (4, 600.0), (5, None)]
    longer = RetrySchedule(max_attempts=8)
    assert [d for _, d in longer.table()] == [5, 25, 120, 600, 600, 600, 600, None], "capped"


def test_out_of_memory_anywhere_in_the_graph_is_fatal_not_transient() -> None:
    assert classify(MemoryError()) == "fatal"
    wrapped = _raise_from(TransientDeliveryError("send failed"), MemoryError())
    assert classify(wrapped) == "fatal", "fatal wins even over an explicit transient"
    assert classify(FatalDeliveryError("worker out of memory")) == "fatal"
    assert classify(OSError("connection reset")) == "transient"


def test_a_timeout_after_sending_is_unknown_and_still_transient() -> None:
    error = _raise_from(RuntimeError("send"), OutcomeUnknown("read timeout"))
    assert is_unknown(error) and classify(error) == "transient"
    assert not is_unknown(TransientDeliveryError("connect refused"))


@pytest.mark.parametrize("status", [400, 401, 403, 429, 500, 502, None])
@pytest.mark.parametrize("text", ["Forbidden: bot was blocked by the user",
                                  "Forbidden: bot was kicked from the supergroup chat",
                                  "Bad Request: not enough rights to send text messages",
                                  "Bad Request: chat not found",
                                  "Forbidden: user is deactivated",
                                  "Forbidden: insufficient permissions"])
def test_a_permanent_text_fails_at_once_whatever_the_status(status: int | None,
                                                           text: str) -> None:
    error = refused(f"telegram {status}: {text}", status=status,
                    pacing=Pacing(5.0, 3600) if status == 429 else None)
    assert type(error) is PermanentDeliveryError


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_credential_stays_an_outage(status: int) -> None:
    error = refused(f"telegram {status}: Unauthorized", status=status)
    assert isinstance(error, CredentialsRefused) and classify(error) == "transient"


def _caused(error: BaseException, cause: BaseException) -> BaseException:
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(("error", "gone"), [
    (refused("webhook answered 410: gone", status=410), True),
    (refused("telegram 403: Forbidden: bot was blocked by the user", status=403), True),
    (refused("telegram 403: Forbidden: bot was kicked from the group chat", status=403), True),
    (refused("telegram 400: Bad Request: chat not found", status=400), True),
    (PermanentDeliveryError("slack: channel_not_found"), True),
    (PermanentDeliveryError("slack: is_archived"), True),
    (refused("webhook answered 404: no such path", status=404), False),
    (refused("telegram 400: Bad Request: message is too long", status=400), False),
    (refused("webhook answered 503: later", status=503), False),
    # a transient error anywhere wins: never disabled on a maybe
    (_caused(TransientDeliveryError("timeout"), PermanentDeliveryError("gone", status=410)),
     False),
    (ValueError("Invalid URL"), False),
])
def test_a_destination_is_gone_only_by_a_permanent_refusal_that_says_so(
        error: BaseException, gone: bool) -> None:
    assert is_gone(error) is gone


def test_a_malformed_entry_is_permanent_and_an_explicit_later_still_wins() -> None:
    assert classify(ValueError("Invalid URL 'http://[::1'")) == "permanent"
    assert classify(TypeError("header value must be str")) == "permanent"
    assert classify(RuntimeError("something no pattern names")) == "transient"
    assert classify(_raise_from(TransientDeliveryError("send failed"),
                                ValueError("bad JSON in the answer"))) == "transient"
