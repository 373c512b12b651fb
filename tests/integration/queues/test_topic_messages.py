"""A topic's messages are its own: what ``sluice publish`` puts on SQS (moto over HTTP) for
an app's topic is the fields the topic declares, keyed as it declares; ``rss.ingest`` keeps
the reference shape and key. Each publish runs the command line in a fresh interpreter with
the app named by ``SLUICE_APP``, as a user runs it; the oracle is the message SQS holds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from sluice.queues.keys import reference_key
from sluice.queues.signing import Signer, canonical
from tests.conftest import BASE_ENV, ROOT, run_cli
from tests.sqs_helpers import create_queues, new_prefix, receive

pytestmark = pytest.mark.aws
SECRET = "queue-secret-for-tests-0123456789"
APP = ROOT / "docs" / "examples" / "exampleapp"


def _env(aws_env: dict[str, str], sqlite_url: str, prefix: str, **more: str) -> dict[str, str]:
    return {**BASE_ENV, **aws_env, "SLUICE_DATABASE_URL": sqlite_url, "SLUICE_QUEUE_MODE": "sqs",
            "SLUICE_QUEUE_PREFIX": prefix, "SLUICE_QUEUE_SIGNING_SECRET": SECRET, **more}


def _published(url: str) -> tuple[dict[str, Any], str]:
    [received] = receive(url)
    body: dict[str, Any] = json.loads(received["Body"])
    assert Signer([SECRET]).check(body) is None
    return body, received["MessageAttributes"]["idempotencyKey"]["StringValue"]


def test_an_app_topics_message_is_its_declared_fields_keyed_by_them(
        aws_env: dict[str, str], sqlite_url: str) -> None:
    prefix = new_prefix()
    urls = create_queues(prefix, ("exampleapp.signup",))
    env = _env(aws_env, sqlite_url, prefix, SLUICE_APP="exampleapp.sluice_ext",
               PYTHONPATH=str(APP))
    fields = {"userId": "u-1", "name": "Ada", "pager": "team-a"}
    done = run_cli(["publish", "exampleapp.signup", "--json"], env, stdin=json.dumps(fields))
    assert done.returncode == 0, done.stderr
    body, key = _published(urls["exampleapp.signup"])
    assert list(body) == ["topic", "userId", "name", "pager", "signature"]
    assert body == {"topic": "exampleapp.signup", **fields, "signature": body["signature"]}
    assert key == json.loads(done.stdout)["idempotencyKey"] == "exampleapp.signup:u-1"
    # a field the topic requires, missing; one it does not declare (the RSS shape's)
    for given, refusal in (({"userId": "u-2", "name": "Bo"},
                            "fields.pager is required by topic exampleapp.signup"),
                           ({**fields, "batchId": "b-1"},
                            ("topic exampleapp.signup has no field 'batchId'; its fields: "
                            "userId, name, pager"))):
        refused = run_cli(["publish", "exampleapp.signup", "--json"], env,
                          stdin=json.dumps(given))
        assert refused.returncode == 64, refused.stderr
        assert refusal in refused.stderr
    assert receive(urls["exampleapp.signup"]) == []


def test_a_topic_without_a_key_is_keyed_by_its_content(aws_env: dict[str, str],
                                                        sqlite_url: str, tmp_path: Path) -> None:
    (tmp_path / "acme_ext.py").write_text(
        "from sluice.extend import MessageField, Topic\n"
        "PACKS = []\n"
        "TOPICS = [Topic('acme.invoice', 'acme.work:handler', "
        "fields=('invoiceId', MessageField('note', required=False)))]\n")
    prefix = new_prefix()
    urls = create_queues(prefix, ("acme.invoice",))
    env = _env(aws_env, sqlite_url, prefix, SLUICE_APP="acme_ext", PYTHONPATH=str(tmp_path))
    done = run_cli(["publish", "acme.invoice"], env, stdin='{"invoiceId": "inv-7"}')
    assert done.returncode == 0, done.stderr
    body, key = _published(urls["acme.invoice"])
    assert list(body) == ["topic", "invoiceId", "signature"]  # the optional field left out
    assert key == f"acme.invoice:{hashlib.sha256(canonical(body)).hexdigest()}"


def test_rss_ingest_keeps_the_reference_shape_and_key(aws_env: dict[str, str],
                                                      sqlite_url: str) -> None:
    prefix = new_prefix()
    urls = create_queues(prefix, ("rss.ingest",))
    done = run_cli(["publish", "rss.ingest"], _env(aws_env, sqlite_url, prefix),
                   stdin='{"feedUrl": "https://feeds.example/a.xml", "note": "x"}')
    assert done.returncode == 0, done.stderr
    body, key = _published(urls["rss.ingest"])
    assert list(body) == ["topic", "batchId", "sourceId", "feedUrl", "publishedAt", "note",
                          "signature"]
    assert (body["sourceId"], body["feedUrl"]) == ("all-sources", "https://feeds.example/a.xml")
    assert key == reference_key(body) and key.startswith(f"rss.ingest:{body['batchId']}:_")
