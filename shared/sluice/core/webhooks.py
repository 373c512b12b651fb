"""Standard Webhooks signatures: what the webhook channel sends and what a receiver checks.

The scheme is the Standard Webhooks specification's (standardwebhooks.com), so a receiver
can verify with any of its libraries (``standardwebhooks`` on PyPI and npm, Svix's):

* ``webhook-id``: the message id, the same on every retry of one entry (receivers
  deduplicate on it);
* ``webhook-timestamp``: integer Unix seconds, signed afresh per request;
* ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">``, one per
  configured secret, space-separated, so a receiver holding either the old or the new
  secret verifies during a rotation.

A secret is ``whsec_<base64 of 24 to 64 bytes>`` (the spec's form). A plain secret of at
least 24 characters is accepted too and signs with its UTF-8 bytes; its standard form, for
the receiver, is :func:`standard_form`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping, Sequence

PREFIX = "whsec_"
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
TOLERANCE_S = 300  # the spec's five minutes, either way
MIN_KEY_BYTES, MAX_KEY_BYTES = 24, 64
MAX_SIGNATURES = 16  # a receiver checks at most this many offered signatures


def key_of(secret: str) -> bytes:
    """The HMAC key of a configured secret; ``ValueError`` says what is wrong with it."""
    if secret.startswith(PREFIX):
        try:
            key = base64.b64decode(secret[len(PREFIX):], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("a whsec_ secret must be base64 after the prefix") from None
        if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
            raise ValueError(f"a whsec_ secret must decode to {MIN_KEY_BYTES} to "
                             f"{MAX_KEY_BYTES} bytes, not {len(key)}")
        return key
    if len(secret) < MIN_KEY_BYTES:
        raise ValueError(f"a plain secret must be at least {MIN_KEY_BYTES} characters "
                         "(or use the whsec_ form)")
    return secret.encode()


def standard_form(secret: str) -> str:
    """``secret`` as ``whsec_<base64>``: what a receiver's Standard Webhooks library takes."""
    return PREFIX + base64.b64encode(key_of(secret)).decode()


def _signature(key: bytes, msg_id: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def sign(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers for one request: one signature per secret, in the given order."""
    if not secrets:
        raise ValueError("no webhook signing secret")
    stamp = str(int(timestamp))
    return {ID_HEADER: msg_id, TIMESTAMP_HEADER: stamp,
            SIGNATURE_HEADER: " ".join(_signature(key_of(s), msg_id, stamp, body)
                                       for s in secrets)}


def verify_webhook(secrets: str | Sequence[str], headers: Mapping[str, str], body: bytes, *,
                   now: float | None = None, tolerance_s: float = TOLERANCE_S) -> bool:
    """What a receiver runs: a ``v1`` signature matches one of ``secrets`` and the timestamp
    is within ``tolerance_s`` of ``now``. Header names are matched in any case."""
    found = {k.lower(): v for k, v in headers.items()}
    msg_id = found.get(ID_HEADER, "")
    stamp = found.get(TIMESTAMP_HEADER, "")
    offered = found.get(SIGNATURE_HEADER, "").split()[:MAX_SIGNATURES]
    if not msg_id or not (stamp.isascii() and stamp.isdigit()) or len(stamp) > 12:
        return False
    if abs((time.time() if now is None else now) - int(stamp)) > tolerance_s:
        return False
    for secret in [secrets] if isinstance(secrets, str) else secrets:
        expected = _signature(key_of(secret), msg_id, stamp, body).encode()
        if any(hmac.compare_digest(expected, sig.encode()) for sig in offered):
            return True
    return False
