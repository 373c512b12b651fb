"""Message signing and publishing as the reference documents describe them, through the
command line (``sluice sign``, ``verify``, ``publish``) against a JavaScript producer's own
code (``tests/js_signing.js``: ``JSON.stringify(Object.entries(msg).sort())``, HMAC-SHA256,
hex, ``timingSafeEqual`` after a length check)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import BASE_ENV, run_cli
from tests.unit.queues.test_signing import VECTORS, run_node

SECRET = "queue-secret-for-tests-0123456789"
OLD_SECRET = "older-queue-secret-0123456789abc"
# a message with non-ASCII text, escapes and an astral character, and one whose key order
# depends on JavaScript's default sort of the [key, value] pairs
SAMPLES = [VECTORS[1], VECTORS[4]]


def env(sqlite_url: str, secret: str | None = SECRET) -> dict[str, str]:
    base = {**BASE_ENV, "SLUICE_DATABASE_URL": sqlite_url}
    return {**base, "SLUICE_QUEUE_SIGNING_SECRET": secret} if secret else base


def test_what_javascript_signs_verifies_and_what_sluice_signs_verifies_in_javascript(
        sqlite_url: str) -> None:
    signed_by_js = run_node([{"secret": SECRET, "text": text} for text in SAMPLES])
    for text, js in zip(SAMPLES, signed_by_js, strict=True):
        message = {**json.loads(text), "signature": js["signature"]}
        # rotation: the secret that signed is accepted behind a newer one
        verified = run_cli(["verify"], env(sqlite_url, f"{OLD_SECRET},{SECRET}"),
                           stdin=json.dumps(message))
        assert (verified.returncode, verified.stdout.strip()) == (0, "valid"), verified.stderr
        tampered = run_cli(["verify"], env(sqlite_url),
                           stdin=json.dumps({**message, "batchId": "other"}))
        assert tampered.returncode == 1 and "signature does not match" in tampered.stderr
    signed_by_sluice = [run_cli(["sign"], env(sqlite_url, f"{SECRET},{OLD_SECRET}"),
                                stdin=json.dumps(json.loads(text))).stdout for text in SAMPLES]
    checked = run_node([{"secret": SECRET, "text": text} for text in signed_by_sluice])
    assert [c["valid"] for c in checked] == [True, True], "signed with the first secret"
    assert all(len(json.loads(t)["signature"]) == 64 for t in signed_by_sluice)  # hex


def test_without_a_secret_nothing_is_published_and_nothing_verifies(sqlite_url: str) -> None:
    signed = run_cli(["sign"], env(sqlite_url), stdin=json.dumps(json.loads(SAMPLES[0]))).stdout
    closed = run_cli(["verify"], env(sqlite_url, None), stdin=signed)
    assert closed.returncode == 1 and "no signing secret is configured" in closed.stderr
    refused = run_cli(["publish", "rss.ingest", "-v"], env(sqlite_url, None), stdin="{}")
    assert refused.returncode == 78 and "SLUICE_QUEUE_SIGNING_SECRET" in refused.stderr
    assert "acknowledged without work" not in refused.stderr, "no consumer ran"


def test_with_sqs_and_no_client_the_publish_fails_instead_of_running_in_process(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    no_config = {"AWS_CONFIG_FILE": str(tmp_path / "none"),
                 "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                 "SLUICE_QUEUE_MODE": "sqs"}
    failed = run_cli(["publish", "rss.ingest", "-v"], {**env(sqlite_url), **no_config},
                     stdin="{}")
    assert failed.returncode != 0
    assert "SLUICE_QUEUE_MODE=sqs but no SQS client" in failed.stderr
    assert "acknowledged without work" not in failed.stderr, "nothing ran in process"
