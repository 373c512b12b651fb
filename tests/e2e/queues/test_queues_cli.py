"""sluice sign / verify / publish / flags / dlq, run as real processes."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from sluice.core.services import Services
from sluice.queues.deadletters import Quarantine
from sluice.queues.signing import Signer
from sluice.rss.store import RssStore
from sluice.store.db import open_database
from sluice.store.flags import FlagStore
from sluice.store.state import StateStore
from tests.conftest import BASE_ENV, run_cli
from tests.sqs_helpers import bodies, create_queues, new_prefix, receive

SECRET = "queue-secret-for-tests-0123456789"
MESSAGE = {"topic": "rss.ingest", "batchId": "b-cli", "sourceId": "all-sources",
           "feedUrl": "", "publishedAt": "2026-11-29T03:20:00.000Z", "note": "caf\u00e9"}


def test_sign_then_verify(sqlite_url: str) -> None:
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": sqlite_url, "SLUICE_QUEUE_SIGNING_SECRET": SECRET}
    signed = run_cli(["sign"], env, stdin=json.dumps(MESSAGE))
    assert signed.returncode == 0, signed.stderr
    message = json.loads(signed.stdout)
    assert Signer([SECRET]).check(message) is None
    ok = run_cli(["verify"], env, stdin=signed.stdout)
    assert ok.returncode == 0 and ok.stdout.strip() == "valid"
    bad = run_cli(["verify"], env, stdin=json.dumps({**message, "batchId": "other"}))
    assert bad.returncode == 1 and "invalid: signature does not match" in bad.stderr
    unset = {k: v for k, v in env.items() if k != "SLUICE_QUEUE_SIGNING_SECRET"}
    closed = run_cli(["verify"], unset, stdin=signed.stdout)
    assert closed.returncode == 1 and "no signing secret is configured" in closed.stderr
    refused = run_cli(["sign"], unset, stdin=json.dumps(MESSAGE))
    assert refused.returncode == 78 and "SLUICE_QUEUE_SIGNING_SECRET" in refused.stderr


def test_flags_on_off_and_tenant_overrides(sqlite_url: str) -> None:
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": sqlite_url}
    assert run_cli(["flags", "rssQueuePipeline", "on"], env).returncode == 0
    db = open_database(sqlite_url)
    RssStore(db).put_scope("t-1", "tenant-1", (), "en", True)
    # The flag is read globally: an override would change nothing, so it is refused.
    over = run_cli(["flags", "rssQueuePipeline", "off", "--tenant", "t-1"], env)
    assert over.returncode == 64, over.stderr
    assert "override_not_honoured" in over.stderr and "would change nothing" in over.stderr
    # One stored before overrides were refused is shown, and can be cleared.
    FlagStore(StateStore(db)).set("rssQueuePipeline", False, "t-1")
    db.close()
    [flag] = json.loads(run_cli(["flags", "--json"], env).stdout)["flags"]
    assert flag["enabled"] is True and flag["overrides"] == {"t-1": False}
    cleared = run_cli(["flags", "rssQueuePipeline", "--tenant", "t-1", "--clear", "--json"], env)
    assert json.loads(cleared.stdout)["overrides"] == {}
    unknown = run_cli(["flags", "nope", "on"], env)
    assert unknown.returncode == 64 and "unknown_flag" in unknown.stderr


def test_publish_in_process_and_refusals(sqlite_url: str) -> None:
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": sqlite_url, "SLUICE_QUEUE_SIGNING_SECRET": SECRET}
    done = run_cli(["publish", "rss.ingest", "--json", "-v"], env, stdin='{"batchId": "b-local"}')
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["mode"] == "local" and result["dispatched"] is True
    assert result["idempotencyKey"].startswith("rss.ingest:b-local:")
    assert "rssQueuePipeline is off; acknowledged without work batch=b-local" in done.stderr
    reserved = run_cli(["publish", "rss.enrich"], env, stdin="{}")
    assert reserved.returncode == 64 and "reserved_topic" in reserved.stderr


@pytest.mark.aws
def test_publish_to_sqs_and_work_the_dlq(aws_env: dict[str, str], sqlite_url: str) -> None:
    prefix = new_prefix()
    urls = create_queues(prefix, ("rss.ingest",))
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": sqlite_url, "SLUICE_QUEUE_SIGNING_SECRET": SECRET,
           "SLUICE_QUEUE_MODE": "sqs", "SLUICE_QUEUE_PREFIX": prefix}
    done = run_cli(["publish", "rss.ingest", "--json"], env, stdin='{"batchId": "b-sqs"}')
    assert done.returncode == 0, done.stderr
    [sent] = receive(urls["rss.ingest"], visibility=0)
    assert sent["MessageId"] == json.loads(done.stdout)["messageId"]

    summary = {"originalMessageId": "m-1", "originalTopic": "rss.ingest", "deliveryCount": 5,
               "failedAt": "2026-11-29T03:00:00.000Z", "errorMessage": "Boom: broke",
               "originalMessage": json.loads(sent["Body"])}
    from tests.sqs_helpers import sqs_client
    sqs_client().send_message(QueueUrl=urls["rss.ingest-dlq"], MessageBody=json.dumps(summary))
    listed = run_cli(["dlq", "list", "rss.ingest", "--json"], env)
    assert listed.returncode == 0, listed.stderr
    [item] = json.loads(listed.stdout)["items"]
    assert item["reason"] == "Boom: broke"
    human = run_cli(["dlq", "list", "rss.ingest"], env)
    assert "rss.ingest: 1 dead letter(s)" in human.stdout and "Boom: broke" in human.stdout
    shown = run_cli(["dlq", "show", "rss.ingest", "m-1", "--json"], env)
    assert json.loads(shown.stdout)["body"]["originalMessageId"] == "m-1"
    dry = run_cli(["dlq", "redrive", "rss.ingest", "--dry-run", "--json"], env)
    assert json.loads(dry.stdout)["count"] == 1 and len(bodies(urls["rss.ingest-dlq"])) == 1
    redriven = run_cli(["dlq", "redrive", "rss.ingest", "--id", item["id"], "--json"], env)
    assert redriven.returncode == 0 and json.loads(redriven.stdout)["count"] == 1
    assert bodies(urls["rss.ingest-dlq"]) == []
    assert len(receive(urls["rss.ingest"], visibility=0)) == 2
    assert run_cli(["dlq", "purge", "rss.ingest"], env).returncode == 64
    purged = run_cli(["dlq", "purge", "rss.ingest", "--all", "--json"], env)
    assert json.loads(purged.stdout) == {"queue": "rss.ingest", "purged": 0}


def test_dlq_redrive_of_a_forgery_is_refused_with_exit_2(
        sqlite_url: str, make_services: Callable[..., Services]) -> None:
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": sqlite_url, "SLUICE_QUEUE_SIGNING_SECRET": SECRET}
    forged = Signer(["someone-else-0123456789abcdef"]).sign(MESSAGE)
    Quarantine(make_services(sqlite_url).db).add("rss.ingest", "m-1", "signature does not match",
                                                 json.dumps(forged))
    listed = run_cli(["dlq", "list", "quarantine"], env)
    assert "quarantine: 1 dead letter(s)" in listed.stdout
    assert "signature does not match" in listed.stdout
    refused = run_cli(["dlq", "redrive", "quarantine", "--json"], env)
    assert refused.returncode == 2, refused.stderr
    assert [r["id"] for r in json.loads(refused.stdout)["refused"]] == ["m-1"]
    assert json.loads(run_cli(["dlq", "purge", "quarantine", "--all", "--json"], env).stdout) == {
        "queue": "quarantine", "purged": 1}
