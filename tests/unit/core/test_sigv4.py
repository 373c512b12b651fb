"""The stdlib SigV4 signer against botocore's ``SigV4Auth`` and AWS's published test suite."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from botocore import auth as botocore_auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotocoreCredentials

from sluice.core import awsjson
from sluice.core.sigv4 import Credentials, host, sign

FROZEN = datetime(2026, 3, 14, 15, 9, 26, tzinfo=UTC)
KEY, SECRET = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
JSON_11 = {"Content-Type": "application/x-amz-json-1.1",
           "X-Amz-Target": "AmazonSSM.GetParameters"}


def _botocore(method: str, url: str, headers: dict[str, str], body: bytes, *, service: str,
              region: str, token: str | None, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setattr(botocore_auth, "get_current_datetime",
                        lambda *a, **k: FROZEN.replace(tzinfo=None))
    request = AWSRequest(method=method, url=url, headers=dict(headers), data=body)
    botocore_auth.SigV4Auth(BotocoreCredentials(KEY, SECRET, token), service,
                            region).add_auth(request)
    return {name: request.headers[name]
            for name in ("X-Amz-Date", "X-Amz-Security-Token", "Authorization")
            if name in request.headers}


@pytest.mark.parametrize("token", [None, "IQoJb3JpZ2luX2VjEJr//////////wEaCmV1LW5vcnRoLTEi+/="])
@pytest.mark.parametrize(("method", "url", "headers", "body"), [
    ("POST", "https://ssm.eu-north-1.amazonaws.com/", JSON_11,
     b'{"Names":["/sluice/prod/CRON_SECRET","/sluice/prod/SENTRY_DSN"],"WithDecryption":true}'),
    ("POST", "http://127.0.0.1:4566/", JSON_11, b'{"Names":["/sluice/prod/A"]}'),
    ("POST", "https://SSM.eu-north-1.amazonaws.com:443", JSON_11, b"{}"),
    ("POST", "https://localhost:8443/ssm/api%20v1/x:y~z/", JSON_11, b'{"Names":["/x"]}'),
    ("POST", "https://secretsmanager.eu-north-1.amazonaws.com/",
     {"Content-Type": "application/x-amz-json-1.1",
      "X-Amz-Target": "secretsmanager.GetSecretValue", "User-Agent": "sluice  test"},
     '{"SecretId":"sluice/prod/ünïcödé ✓ 秘密"}'.encode()),
    ("POST", "https://ssm.eu-north-1.amazonaws.com/", JSON_11,
     '{"Names":["/sluice/€/ключ"]}'.encode()),
    ("GET", "https://example.amazonaws.com/a/./b/../c//d/?Param2=value2&Param1=value%201",
     {"X-Custom": "  spaced    out  value "}, b""),
])
def test_signature_is_byte_identical_to_botocore(
        method: str, url: str, headers: dict[str, str], body: bytes, token: str | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _botocore(method, url, headers, body, service="ssm", region="eu-north-1",
                         token=token, monkeypatch=monkeypatch)

    ours = sign(method, url, headers, body, service="ssm", region="eu-north-1",
                credentials=Credentials(KEY, SECRET, token), now=FROZEN)

    assert ours == expected
    assert ("X-Amz-Security-Token" in ours) == (token is not None)
    assert ours["X-Amz-Date"] == "20260314T150926Z"


def test_the_request_the_stdlib_client_sends_is_signed_as_botocore_signs_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN the client's own request: its body, headers and endpoint
    client = awsjson.JsonClient("https://ssm.eu-north-1.amazonaws.com", "ssm", "AmazonSSM",
                                "eu-north-1", Credentials(KEY, SECRET, "session-token"))
    body, headers = client.request("GetParameters", {"Names": ["/sluice/prod/ü"],
                                                     "WithDecryption": True}, now=FROZEN)
    unsigned = {k: v for k, v in headers.items()
                if k not in ("X-Amz-Date", "X-Amz-Security-Token", "Authorization", "Host")}

    # WHEN botocore signs the same request
    expected = _botocore("POST", client.url, unsigned, body, service="ssm",
                         region="eu-north-1", token="session-token", monkeypatch=monkeypatch)

    # THEN the signature headers are the same bytes, and Host is the one both signed
    assert {k: headers[k] for k in expected} == expected
    assert headers["Host"] == "ssm.eu-north-1.amazonaws.com"
    assert unsigned == {"Content-Type": "application/x-amz-json-1.1",
                        "X-Amz-Target": "AmazonSSM.GetParameters"}


# AWS's Signature Version 4 test suite (aws-sig-v4-test-suite): its credentials, date, scope.
SUITE = {"service": "service", "region": "us-east-1",
         "credentials": Credentials(KEY, SECRET), "now": datetime(2015, 8, 30, 12, 36, tzinfo=UTC)}


@pytest.mark.parametrize(("name", "url", "signature"), [
    ("get-vanilla", "https://example.amazonaws.com/",
     "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
    ("get-vanilla-query-order-key-case",
     "https://example.amazonaws.com/?Param2=value2&Param1=value1",
     "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"),
])
def test_aws_signature_v4_test_suite(name: str, url: str, signature: str) -> None:
    headers = sign("GET", url, {}, b"", **SUITE)  # type: ignore[arg-type]

    assert headers["X-Amz-Date"] == "20150830T123600Z", name
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        f"SignedHeaders=host;x-amz-date, Signature={signature}"), name


@pytest.mark.parametrize(("url", "expected"), [
    ("https://ssm.eu-north-1.amazonaws.com/", "ssm.eu-north-1.amazonaws.com"),
    ("https://SSM.eu-north-1.amazonaws.com:443/", "ssm.eu-north-1.amazonaws.com"),
    ("http://127.0.0.1:80/", "127.0.0.1"),
    ("http://127.0.0.1:4566/", "127.0.0.1:4566"),
    ("https://[::1]:8443/", "[::1]:8443"),
])
def test_host_drops_only_the_default_port(url: str, expected: str) -> None:
    assert host(url) == expected
    assert botocore_auth._host_from_url(url) == expected


LAMBDA = {"AWS_ACCESS_KEY_ID": "ASIA", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t",
          "AWS_REGION": "eu-north-1", "AWS_DEFAULT_REGION": "eu-north-1"}


@pytest.mark.parametrize(("service", "extra", "url"), [
    ("ssm", {}, "https://ssm.eu-north-1.amazonaws.com/"),
    ("secretsmanager", {}, "https://secretsmanager.eu-north-1.amazonaws.com/"),
    ("ssm", {"AWS_REGION": "cn-north-1"}, "https://ssm.cn-north-1.amazonaws.com.cn/"),
    ("ssm", {"AWS_ENDPOINT_URL": "http://127.0.0.1:4566"}, "http://127.0.0.1:4566/"),
    ("ssm", {"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_ENDPOINT_URL_SSM":
             "http://127.0.0.1:2/"}, "http://127.0.0.1:2/"),
    ("secretsmanager", {"AWS_ENDPOINT_URL_SECRETS_MANAGER": "http://127.0.0.1:3"},
     "http://127.0.0.1:3/"),
    ("ssm", {"AWS_ENDPOINT_URL_SSM": "http://127.0.0.1:2",
             "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"},
     "https://ssm.eu-north-1.amazonaws.com/"),
])
def test_endpoint_is_resolved_as_botocore_resolves_it(service: str, extra: dict[str, str],
                                                      url: str) -> None:
    client = awsjson.from_environ(service, {**LAMBDA, **extra})

    assert client is not None
    assert client.url == url
    assert client.region == {**LAMBDA, **extra}["AWS_REGION"]
    assert client.credentials == Credentials("ASIA", "s", "t")


@pytest.mark.parametrize("change", [
    {"AWS_ACCESS_KEY_ID": ""}, {"AWS_SECRET_ACCESS_KEY": ""},
    {"AWS_REGION": "", "AWS_DEFAULT_REGION": ""}, {"HTTPS_PROXY": "http://127.0.0.1:3128"},
    {"AWS_USE_FIPS_ENDPOINT": "true"}, {"AWS_USE_DUALSTACK_ENDPOINT": "true"},
    {"AWS_REGION": "us-isob-east-1"},
])
def test_without_environment_credentials_or_with_special_routing_botocore_is_used(
        change: dict[str, str]) -> None:
    assert awsjson.from_environ("ssm", {**LAMBDA, **change}) is None


@pytest.mark.parametrize(("extra", "roots"), [
    ({}, 5),  # the aws partition's default endpoint: the Amazon Trust Services roots first
    ({"AWS_REGION": "cn-north-1"}, None),  # China's endpoints chain elsewhere
    ({"AWS_REGION": "us-gov-west-1"}, None),
    ({"AWS_ENDPOINT_URL_SSM": "https://127.0.0.1:4566"}, None),  # a configured endpoint
])
def test_a_default_aws_endpoint_is_verified_against_the_amazon_roots_first(
        extra: dict[str, str], roots: int | None) -> None:
    client = awsjson.from_environ("ssm", {**LAMBDA, **extra})

    assert client is not None
    store = client.tls_context().cert_store_stats()
    if roots is None:
        assert store["x509_ca"] > 5, "the whole system store"
    else:
        assert store == {"x509": roots, "crl": 0, "x509_ca": roots}


def test_aws_ca_bundle_replaces_the_amazon_roots(tmp_path: Path) -> None:
    bundle = tmp_path / "corporate.pem"
    bundle.write_text(Path(awsjson.AWS_ROOTS).read_text().split("# Amazon_Root_CA_2")[0])
    client = awsjson.from_environ("ssm", {**LAMBDA, "AWS_CA_BUNDLE": str(bundle)})

    assert client is not None
    assert client.tls_context().cert_store_stats()["x509_ca"] == 1
