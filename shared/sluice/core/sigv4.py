"""AWS Signature Version 4 for a request's headers, with the standard library alone.

AWS's documented algorithm (canonical request, string to sign, derived signing key), in
the form botocore's ``SigV4Auth`` gives it: the same signed headers (every header but the
hop-by-hop and tracing ones, plus ``host``), the same canonical path and query, the body's
SHA-256. The tests hold it byte for byte to botocore's signer and to AWS's test suite. It
exists because importing botocore costs more than the cold start may spend on secrets.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import NamedTuple
from urllib.parse import quote, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED = frozenset({"baggage", "connection", "expect", "keep-alive", "proxy-authenticate",
                      "proxy-authorization", "te", "traceparent", "tracestate", "trailer",
                      "transfer-encoding", "upgrade", "user-agent", "x-amzn-trace-id"})


class Credentials(NamedTuple):
    access_key: str
    secret_key: str
    token: str | None = None


def host(url: str) -> str:
    """The ``Host`` a signature covers: lowercase, without a scheme's default port."""
    parts = urlsplit(url)
    name = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname or ""
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return name if parts.port in (None, default) else f"{name}:{parts.port}"


def _canonical_path(path: str) -> str:
    segments: list[str] = []
    for segment in path.split("/"):  # RFC 3986 dot segments out, empty segments too
        if segment == "..":
            del segments[-1:]
        elif segment not in ("", "."):
            segments.append(segment)
    trailing = "/" if path.endswith("/") and segments else ""
    return quote("/" + "/".join(segments) + trailing, safe="/~")


def sign(method: str, url: str, headers: Mapping[str, str], body: bytes, *, service: str,
         region: str, credentials: Credentials, now: datetime | None = None) -> dict[str, str]:
    """The headers to add to the request: ``X-Amz-Date``, ``X-Amz-Security-Token`` (with a
    session token) and ``Authorization``. Send ``Host`` as ``host(url)``."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    added = {"X-Amz-Date": stamp}
    if credentials.token:
        added["X-Amz-Security-Token"] = credentials.token
    signed = {"host": host(url)}
    signed.update({k.lower(): " ".join(v.split()) for k, v in {**headers, **added}.items()
                   if k.lower() not in UNSIGNED})
    names = ";".join(sorted(signed))
    parts = urlsplit(url)
    query = "&".join(f"{k}={v}" for k, _, v in sorted(
        pair.partition("=") for pair in parts.query.split("&"))) if parts.query else ""
    canonical = "\n".join([method.upper(), _canonical_path(parts.path), query,
                           "".join(f"{k}:{signed[k]}\n" for k in sorted(signed)), names,
                           hashlib.sha256(body).hexdigest()])
    scope = f"{stamp[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, stamp, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + credentials.secret_key).encode()
    for part in (stamp[:8], region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    added["Authorization"] = (f"{ALGORITHM} Credential={credentials.access_key}/{scope}, "
                              f"SignedHeaders={names}, Signature={signature}")
    return added
