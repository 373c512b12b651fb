"""AWS JSON 1.1 calls over ``http.client``: the cold start's secret reads without botocore.

SSM ``GetParameters`` and Secrets Manager ``GetSecretValue`` are one signed POST each
(``X-Amz-Target: <prefix>.<Operation>``, a JSON body, a JSON answer). ``from_environ``
builds a client only where that is all it takes: credentials in the environment (as Lambda
gives them), no proxy, no FIPS or dual-stack endpoint, a commercial, China or GovCloud
region. Elsewhere it returns None and the caller uses botocore, which knows profiles, SSO
and the rest. The endpoint is ``AWS_ENDPOINT_URL_<SERVICE>`` or ``AWS_ENDPOINT_URL`` as
botocore reads them, else the service's regional one over HTTPS with the certificate
verified (``AWS_CA_BUNDLE`` honoured). A default endpoint of the aws partition is verified
first against the Amazon Trust Services roots alone (``aws-roots.pem``: 5 certificates,
well under a millisecond to load, where the whole store costs 30-50 ms of the cold
start); a handshake they do not verify is tried once more against the whole store.
Throttling, 5xx answers and connection failures are retried like botocore's standard
mode (three attempts in all, jittered backoff).
"""

from __future__ import annotations

import http.client
import json
import random
import ssl
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sluice.core.sigv4 import Credentials, host, sign

MAX_ATTEMPTS = 3
BACKOFF_SECONDS = 0.1  # first retry within 0.1 s, the second within 0.2 s
TIMEOUT_SECONDS = 5.0
# service -> (signing name, X-Amz-Target prefix, endpoint variable suffix), as botocore names them
SERVICES = {"ssm": ("ssm", "AmazonSSM", "SSM"),
            "secretsmanager": ("secretsmanager", "secretsmanager", "SECRETS_MANAGER")}
THROTTLING = frozenset({"Throttling", "ThrottlingException", "ThrottledException",
                        "RequestThrottledException", "TooManyRequestsException",
                        "RequestLimitExceeded", "RequestThrottled", "SlowDown"})
# The roots the aws partition's service endpoints chain to (not China's, not GovCloud's).
AWS_ROOTS = str(Path(__file__).with_name("aws-roots.pem"))
NOT_FOR_US = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
              "AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT")


class AwsError(Exception):
    """An AWS call failed: the service's error code, or ``ConnectionError``."""

    def __init__(self, code: str, message: str, status: int | None = None, *,
                 transient: bool) -> None:
        super().__init__(f"{code}: {message}" if status is None
                         else f"{code} (HTTP {status}): {message}")
        self.code = code
        self.status = status
        self.transient = transient  # worth another attempt: throttled, 5xx, no connection


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def from_environ(service: str, environ: Mapping[str, str]) -> JsonClient | None:
    """A client for ``service`` when the environment alone says how to reach it."""
    key, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if (not key or not secret or not region or region.startswith(("us-iso", "eu-isoe"))
            or any(environ.get(name) for name in NOT_FOR_US[:4])
            or any(_true(environ.get(name)) for name in NOT_FOR_US[4:])):
        return None
    signing_name, prefix, suffix = SERVICES[service]
    endpoint = None
    if not _true(environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")):
        endpoint = environ.get(f"AWS_ENDPOINT_URL_{suffix}") or environ.get("AWS_ENDPOINT_URL")
    ca_bundle = environ.get("AWS_CA_BUNDLE") or None
    first = None
    if not endpoint:
        domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
        endpoint = f"https://{signing_name}.{region}.{domain}"
        if ca_bundle is None and not region.startswith(("cn-", "us-gov-")):
            first = AWS_ROOTS
    credentials = Credentials(key, secret, environ.get("AWS_SESSION_TOKEN") or None)
    return JsonClient(endpoint, signing_name, prefix, region, credentials,
                      ca_bundle=ca_bundle, first_ca_bundle=first)


class JsonClient:
    """One service's endpoint, one kept-alive connection, calls by operation name."""

    def __init__(self, endpoint: str, signing_name: str, target_prefix: str, region: str,
                 credentials: Credentials, *, ca_bundle: str | None = None,
                 first_ca_bundle: str | None = None,
                 timeout: float = TIMEOUT_SECONDS) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) endpoint: {endpoint!r}")
        self.url = f"{parts.scheme}://{parts.netloc}{parts.path or '/'}"
        self.signing_name, self.target_prefix = signing_name, target_prefix
        self.region, self.credentials = region, credentials
        self._ca_bundle, self._timeout = ca_bundle, timeout
        # Tried before ``ca_bundle`` (None: the system store) until a handshake it does not
        # verify: then dropped for good.
        self._first_ca_bundle = first_ca_bundle
        self._connection: http.client.HTTPConnection | None = None

    def call(self, operation: str, params: Mapping[str, Any]) -> dict[str, Any]:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                return self._once(operation, params)
            except AwsError as exc:
                if not exc.transient or attempt == MAX_ATTEMPTS:
                    raise
            time.sleep(random.uniform(0, BACKOFF_SECONDS * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")

    def get_parameters(self, **params: Any) -> dict[str, Any]:
        return self.call("GetParameters", params)

    def get_secret_value(self, **params: Any) -> dict[str, Any]:
        return self.call("GetSecretValue", params)

    def _connect(self) -> http.client.HTTPConnection:
        if self._connection is None:
            parts = urlsplit(self.url)
            if parts.scheme == "https":
                context = self.tls_context()
                self._connection = http.client.HTTPSConnection(
                    parts.hostname or "", parts.port, timeout=self._timeout, context=context)
            else:
                self._connection = http.client.HTTPConnection(
                    parts.hostname or "", parts.port, timeout=self._timeout)
        return self._connection

    def tls_context(self) -> ssl.SSLContext:
        """The context the next HTTPS connection verifies the endpoint with."""
        return ssl.create_default_context(cafile=self._first_ca_bundle or self._ca_bundle)

    def request(self, operation: str, params: Mapping[str, Any], *,
                now: datetime | None = None) -> tuple[bytes, dict[str, str]]:
        """The body and headers of one call, signed."""
        body = json.dumps(params, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/x-amz-json-1.1",
                   "X-Amz-Target": f"{self.target_prefix}.{operation}"}
        headers.update(sign("POST", self.url, headers, body, service=self.signing_name,
                            region=self.region, credentials=self.credentials, now=now))
        headers["Host"] = host(self.url)
        return body, headers

    def _once(self, operation: str, params: Mapping[str, Any]) -> dict[str, Any]:
        body, headers = self.request(operation, params)
        connection = self._connect()
        try:
            connection.request("POST", urlsplit(self.url).path, body, headers)
            response = connection.getresponse()
            status, raw = response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            refused = isinstance(exc, ssl.SSLCertVerificationError)
            if refused and self._first_ca_bundle is not None:
                # Not one of the narrow bundle's roots: once more against the whole store
                # (nothing was sent: the handshake comes before the request).
                self._first_ca_bundle, self._connection = None, None
                return self._once(operation, params)
            raise AwsError("ConnectionError", f"{self.url}: {exc!r}",
                           transient=not refused) from exc
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = None
        if 200 <= status < 300 and isinstance(answer, dict):
            return answer
        if not isinstance(answer, dict):
            answer = {}
        code = str(answer.get("__type") or answer.get("code") or f"HTTP{status}")
        code = code.rpartition("#")[2].partition(":")[0]
        message = str(answer.get("message") or answer.get("Message") or raw[:200].decode(
            "utf-8", "replace"))
        raise AwsError(code, message, status,
                       transient=status >= 500 or status == 429 or code in THROTTLING)
