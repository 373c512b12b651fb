"""The SQS stand-in's throttled windows (``--limits``): one send a minute is answered, the
others time out unanswered, through the real ``Sqs`` wrapper as a ``TransientStoreError``
(what the tick's fan-out catches), and the service keeps its own record of them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bench.simulate.peers import Window
from bench.simulate.queues import THROTTLE_GAP, SimSqsClient

T0 = datetime(2026, 1, 5, tzinfo=UTC)
NAME = "sluice-sim-rss-ingest"


def _client(now: list[datetime]) -> SimSqsClient:
    ids = iter(range(1000))
    client = SimSqsClient(lambda: now[0], lambda: f"m-{next(ids)}", [NAME, f"{NAME}-dlq"])
    client.throttled = [Window(T0 + timedelta(hours=1), T0 + timedelta(hours=2),
                               "sqs_throttled")]
    return client


def test_a_throttled_endpoint_answers_one_send_a_minute_and_records_the_rest() -> None:
    from botocore.exceptions import ReadTimeoutError  # type: ignore[import-untyped]

    now = [T0]
    client = _client(now)
    url = client.url_of(NAME)
    for _ in range(3):  # before the window: every send answered
        client.send_message(QueueUrl=url, MessageBody="{}", MessageAttributes={})
    now[0] = T0 + timedelta(hours=1)
    client.send_message(QueueUrl=url, MessageBody="{}", MessageAttributes={})
    with pytest.raises(ReadTimeoutError):
        client.send_message(QueueUrl=url, MessageBody="{}", MessageAttributes={})
    now[0] += THROTTLE_GAP - timedelta(seconds=1)
    with pytest.raises(ReadTimeoutError):
        client.send_message(QueueUrl=url, MessageBody="{}", MessageAttributes={})
    now[0] += timedelta(seconds=1)
    client.send_message(QueueUrl=url, MessageBody="{}", MessageAttributes={})
    assert [at for at, _ in client.unanswered] == [T0 + timedelta(hours=1),
                                                   T0 + timedelta(hours=1, seconds=59)]
    assert len(client.queues[NAME].messages) == 5  # the unanswered ones never arrived
    now[0] = T0 + timedelta(hours=2)  # the window is over
    for _ in range(3):
        client.send_message(QueueUrl=url, MessageBody="{}", MessageAttributes={})
    assert len(client.unanswered) == 2


def test_an_unanswered_send_is_a_transient_store_error_to_the_wrapper() -> None:
    from sluice.core.errors import TransientStoreError
    from sluice.queues.sqs import Sqs

    now = [T0 + timedelta(hours=1, minutes=5)]
    client = _client(now)
    sqs = Sqs(client, "sluice-sim-")
    url = client.url_of(NAME)
    assert sqs.send(url, "{}", "k")
    with pytest.raises(TransientStoreError):
        sqs.send(url, "{}", "k")


def test_a_crashed_receive_counts_towards_its_own_messages_dead_letter_and_no_others() -> None:
    """A message dead-lettered at its fifth receive after four failures of its own and one
    invocation that crashed holding it is as documented (SQS counts the receive the function
    died in); the same crash, holding another message, forgives nothing here."""
    from bench.simulate.queues import MAX_ATTEMPTS, receives_charged

    failed_at = {("m-1", 2), ("m-1", 3), ("m-1", 4), ("m-1", 5), ("m-2", 1)}
    own, crashed = receives_charged("m-1", failed_at, {"m-1": 1})
    assert (own, crashed) == (4, 1) and own + crashed >= MAX_ATTEMPTS
    own, crashed = receives_charged("m-1", failed_at, {"m-2": 1})
    assert own + crashed < MAX_ATTEMPTS  # dead-lettered one receive early: a violation
    assert receives_charged("m-2", failed_at, {}) == (1, 0)
