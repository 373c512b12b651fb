"""The payload: parts, addressing options, the old single-text shape, and a 400 naming any
field a channel does not take."""

from __future__ import annotations

import pytest

from sluice.core.errors import RequestError
from sluice.delivery.drain import check_enqueue
from sluice.delivery.payload import Message, parse


def test_parts_and_options() -> None:
    message = parse("telegram", {"payloads": ["a", {"text": "b"}, "  "], "accountId": "bot2",
                                 "threadId": 42, "replyToId": "7", "silent": True,
                                 "bestEffort": True})
    assert message == Message(parts=("a", "b"), account_id="bot2", thread_id="42",
                              reply_to_id="7", silent=True, best_effort=True)


def test_the_single_text_shape_is_one_part() -> None:
    assert parse("slack", {"text": "hello"}).parts == ("hello",)


def test_the_webhook_takes_any_json_object() -> None:
    assert parse("webhook", {"alert": "cpu", "nested": {"a": 1}}).parts == ()
    # keys named like the other channels' options are the receiver's data, never checked
    event = {"accountId": "acct 123", "silent": "no", "threadId": "", "payloads": [{"id": 1}],
             "text": 5, "gatewayClientScopes": "all"}
    assert parse("webhook", event) == Message(parts=())
    check_enqueue("webhook", event)


@pytest.mark.parametrize(("channel", "payload", "field"), [
    ("telegram", {"text": "x", "parseMode": "HTML"}, "parseMode"),
    ("slack", {"text": "x", "threadTs": "1.2"}, "threadTs"),
    ("telegram", {"text": "x", "subject": "s"}, "subject"),
    ("email", {"text": "x", "blocks": []}, "blocks"),
    ("slack", {"payloads": [{"text": "x", "media": "y"}]}, "payloads[0].media"),
    ("slack", {"payloads": [3]}, "payloads[0]"),
    ("slack", {"payloads": "x"}, "payloads"),
    ("slack", {"text": "x", "payloads": ["y"]}, "text"),
    ("telegram", {"text": "x", "silent": "yes"}, "silent"),
    ("telegram", {"text": "x", "threadId": ""}, "threadId"),
    ("telegram", {}, "payloads"),
    ("telegram", {"payloads": ["   "]}, "payloads"),
])
def test_a_field_a_channel_does_not_take_is_a_400_naming_it(
        channel: str, payload: dict[str, object], field: str) -> None:
    with pytest.raises(RequestError) as info:
        parse(channel, payload)
    assert info.value.status == 400 and info.value.context == {"field": field}


def test_an_unknown_channel_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(RequestError, match="unknown channel 'sms'; known: webhook, slack, "
                                           "telegram, email"):
        check_enqueue("sms", {"text": "x"})


def test_every_field_of_the_document_is_accepted_and_kept() -> None:
    payload = {"text": "t", "gifPlayback": True, "forceDocument": False, "mirror": True,
               "gatewayClientScopes": ["operator.write"], "mediaUrl": "https://x.test/a.gif"}
    message = parse("telegram", payload)
    assert (message.gif_playback, message.force_document, message.mirror) == (True, False, True)
    assert message.gateway_client_scopes == ("operator.write",)
    assert message.media_url == "https://x.test/a.gif"
    slack = parse("slack", {k: v for k, v in payload.items() if k != "mediaUrl"})
    assert slack.gif_playback and slack.mirror, "accepted everywhere, used where a channel can"


@pytest.mark.parametrize(("channel", "payload", "field"), [
    ("telegram", {"text": "x", "gifPlayback": "yes"}, "gifPlayback"),
    ("slack", {"text": "x", "gatewayClientScopes": "admin"}, "gatewayClientScopes"),
    ("telegram", {"mediaUrl": "http://plain.test/a.png"}, "mediaUrl"),
    ("slack", {"text": "x", "mediaUrl": "https://x.test/a.png"}, "mediaUrl"),
])
def test_the_documents_fields_are_checked(channel: str, payload: dict[str, object],
                                          field: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse(channel, payload)
    assert caught.value.context["field"] == field
