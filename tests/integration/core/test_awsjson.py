"""The stdlib AWS JSON client's retries and certificate check, against a loopback endpoint
that answers what each test sets."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from sluice.core.awsjson import AWS_ROOTS, MAX_ATTEMPTS, AwsError, JsonClient
from sluice.core.sigv4 import Credentials


class Failing(BaseHTTPRequestHandler):
    """Answers every POST with the status and error body the test sets; counts them."""

    answer: ClassVar[tuple[int, dict[str, str]]] = (500, {})
    requests: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).requests.append(dict(self.headers))
        status, body = self.answer
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    Failing.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _client(endpoint: str) -> JsonClient:
    return JsonClient(endpoint, "ssm", "AmazonSSM", "eu-north-1",
                      Credentials("testing", "testing", "token"))


@pytest.mark.parametrize(("status", "error_type", "code"), [
    (400, "com.amazonaws.ssm#ThrottlingException", "ThrottlingException"),
    (503, "ServiceUnavailable", "ServiceUnavailable"),
    (500, "InternalServerError", "InternalServerError"),
])
def test_throttling_and_5xx_are_retried_then_raised(endpoint: str, status: int,
                                                   error_type: str, code: str) -> None:
    Failing.answer = (status, {"__type": error_type, "message": "slow down"})

    with pytest.raises(AwsError) as caught:
        _client(endpoint).get_parameters(Names=["/a"], WithDecryption=True)

    assert (caught.value.code, caught.value.status, caught.value.transient) == (code, status, True)
    assert len(Failing.requests) == MAX_ATTEMPTS
    assert all(r["X-Amz-Target"] == "AmazonSSM.GetParameters" for r in Failing.requests)


def test_a_client_error_is_raised_at_once(endpoint: str) -> None:
    Failing.answer = (400, {"__type": "com.amazonaws.ssm#AccessDeniedException",
                            "Message": "not allowed"})

    with pytest.raises(AwsError, match="not allowed") as caught:
        _client(endpoint).get_parameters(Names=["/a"], WithDecryption=True)

    assert (caught.value.code, caught.value.transient) == ("AccessDeniedException", False)
    assert len(Failing.requests) == 1


@pytest.fixture
def tls_endpoint(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The same server over HTTPS with a self-signed certificate for 127.0.0.1; its URL and
    the certificate's file."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    Failing.requests = []
    Failing.answer = (200, {"Parameters": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}", str(cert)
    server.shutdown()
    server.server_close()


def test_https_verifies_the_certificate(tls_endpoint: tuple[str, str]) -> None:
    url, cert = tls_endpoint
    untrusted = JsonClient(url, "ssm", "AmazonSSM", "eu-north-1", Credentials("k", "s"))

    # a certificate no trusted authority signed: refused at once, nothing sent
    with pytest.raises(AwsError, match="CERTIFICATE_VERIFY_FAILED") as caught:
        untrusted.get_parameters(Names=["/a"], WithDecryption=True)
    assert (caught.value.code, caught.value.transient) == ("ConnectionError", False)
    assert Failing.requests == []

    # the same certificate named as the CA bundle (AWS_CA_BUNDLE): the call goes through
    trusted = JsonClient(url, "ssm", "AmazonSSM", "eu-north-1", Credentials("k", "s"),
                         ca_bundle=cert)
    assert trusted.get_parameters(Names=["/a"], WithDecryption=True) == {"Parameters": []}
    assert len(Failing.requests) == 1


def test_a_handshake_the_amazon_roots_refuse_is_tried_once_against_the_whole_bundle(
        tls_endpoint: tuple[str, str]) -> None:
    url, cert = tls_endpoint
    # AWS_CA_BUNDLE names the endpoint's certificate; the narrow bundle does not hold it
    client = JsonClient(url, "ssm", "AmazonSSM", "eu-north-1", Credentials("k", "s"),
                        ca_bundle=cert, first_ca_bundle=AWS_ROOTS)

    assert client.get_parameters(Names=["/a"], WithDecryption=True) == {"Parameters": []}
    assert len(Failing.requests) == 1, "nothing is sent over a refused handshake"
    assert client.get_parameters(Names=["/b"], WithDecryption=True) == {"Parameters": []}
    assert client.tls_context().cert_store_stats()["x509_ca"] == 1, "the narrow bundle is dropped"


def test_a_certificate_neither_bundle_verifies_is_refused_at_once(
        tls_endpoint: tuple[str, str]) -> None:
    url, _ = tls_endpoint
    client = JsonClient(url, "ssm", "AmazonSSM", "eu-north-1", Credentials("k", "s"),
                        first_ca_bundle=AWS_ROOTS)

    with pytest.raises(AwsError, match="CERTIFICATE_VERIFY_FAILED") as caught:
        client.get_parameters(Names=["/a"], WithDecryption=True)
    assert (caught.value.code, caught.value.transient) == ("ConnectionError", False)
    assert Failing.requests == []
