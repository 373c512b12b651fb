"""Standard Webhooks signatures, judged by the ``standardwebhooks`` library from PyPI (the
receivers' own code), in both directions and across a secret rotation."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks import Webhook, WebhookVerificationError

from sluice.core.webhooks import key_of, sign, standard_form, verify_webhook

OLD = "whsec_" + base64.b64encode(b"o" * 32).decode()
NEW = "whsec_" + base64.b64encode(b"n" * 24).decode()
PLAIN = "a-plain-secret-of-24-chars"
BODY = b'{"alert":"cpu","text":"hot"}'


def test_the_library_verifies_what_sluice_signs_and_sluice_what_the_library_signs() -> None:
    now = int(time.time())
    for secret in (OLD, NEW, PLAIN):
        headers = sign([secret], "alert:cpu:1", now, BODY)
        assert Webhook(standard_form(secret)).verify(BODY, headers) == {"alert": "cpu",
                                                                        "text": "hot"}
        library = Webhook(standard_form(secret))
        theirs = {"webhook-id": "msg_1", "webhook-timestamp": str(now),
                  "webhook-signature": library.sign("msg_1", datetime.fromtimestamp(now, tz=UTC),
                                                    BODY.decode())}
        assert verify_webhook(secret, theirs, BODY)


def test_during_a_rotation_either_secret_verifies_and_no_other() -> None:
    headers = sign([NEW, OLD], "id-1", int(time.time()), BODY)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (NEW, OLD):
        Webhook(secret).verify(BODY, headers)
        assert verify_webhook(secret, headers, BODY)
    with pytest.raises(WebhookVerificationError):
        Webhook(standard_form(PLAIN)).verify(BODY, headers)
    assert not verify_webhook(PLAIN, headers, BODY)
    assert verify_webhook([PLAIN, OLD], headers, BODY)


def test_a_tampered_body_or_a_stale_timestamp_is_refused() -> None:
    now = int(time.time())
    headers = sign([OLD], "id-1", now, BODY)
    with pytest.raises(WebhookVerificationError):
        Webhook(OLD).verify(b'{"alert":"cpu","text":"HOT"}', headers)
    assert not verify_webhook(OLD, headers, b'{"alert":"cpu","text":"HOT"}')
    stale = sign([OLD], "id-1", now - 301, BODY)
    with pytest.raises(WebhookVerificationError):
        Webhook(OLD).verify(BODY, stale)
    assert not verify_webhook(OLD, stale, BODY)
    assert verify_webhook(OLD, stale, BODY, now=now - 300)
    assert not verify_webhook(OLD, {**headers, "webhook-id": "id-2"}, BODY), "the id is signed"


@given(st.dictionaries(st.sampled_from(["webhook-id", "Webhook-Timestamp", "webhook-signature",
                                        "x"]), st.text(max_size=80), max_size=4))
def test_hostile_headers_are_refused_without_raising(headers: dict[str, str]) -> None:
    assert verify_webhook(OLD, headers, BODY) is False


def test_secrets_outside_the_spec_are_refused() -> None:
    assert len(key_of(OLD)) == 32 and key_of(PLAIN) == PLAIN.encode()
    for bad in ("whsec_" + base64.b64encode(b"x" * 23).decode(),
                "whsec_" + base64.b64encode(b"x" * 65).decode(), "whsec_%%%", "short"):
        with pytest.raises(ValueError):
            key_of(bad)
    with pytest.raises(ValueError):
        sign([], "id", 1, BODY)
