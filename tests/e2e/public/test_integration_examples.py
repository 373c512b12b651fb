"""The examples of docs/integration.md, run: the Python one as an app would run it, the
JavaScript one under Node, each checked against what Sluice itself does."""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn

from sluice.billing.usage import RETRY_QUEUE, RetryEnvelope, UsageEntry, write_entries
from sluice.core.settings import Settings
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.erasure.requests import ErasureStore
from sluice.http.app import create_app
from sluice.ops.access import mint_token
from sluice.queues.keys import idempotency_key
from sluice.queues.signing import Signer, canonical
from sluice.store.db import open_database
from sluice.store.redis_clients import connect
from tests.conftest import BASE_ENV, ROOT, free_port, start_dev
from tests.unit.queues.test_signing import VECTORS

EXAMPLES = ROOT / "docs" / "examples"
SECRET = "integration-secret-0123456789"


def node(script: str, payload: Any) -> Any:
    """Run ``script`` with ``app`` = docs/examples/app.js and ``input`` = ``payload``;
    it prints its answer as JSON."""
    program = (f"const app = require({json.dumps(str(EXAMPLES / 'app.js'))});\n"
               "const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));\n"
               f"(async () => {{ {script} }})().catch(e => {{ console.error(e); process.exit(1); }});")
    done = subprocess.run(["node", "-e", program], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def python_example(hooks: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EXAMPLES / "app_python.py"), *hooks],
                          env={**BASE_ENV, **env, "PATH": "/usr/bin:/bin"}, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


# --- Python ----------------------------------------------------------------------------


def test_the_python_example_feeds_every_store(sqlite_url: str) -> None:
    env = {"SLUICE_DATABASE_URL": sqlite_url, "SLUICE_QUEUE_SIGNING_SECRET": SECRET}
    hooks = ["publish", "deliver", "usage", "erase", "deliver"]
    done = python_example(hooks, env)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    outputs = dict(zip(hooks, lines, strict=True))
    assert outputs["publish"]["dispatched"] is True and outputs["publish"]["mode"] == "local"
    assert outputs["deliver"]["status"] == "pending"
    assert outputs["deliver"]["idempotencyKey"] == "signup:u-docs"
    assert outputs["usage"] == {"outcome": "recorded"}
    assert outputs["erase"]["status"] == "requested"
    assert lines[1]["id"] == lines[4]["id"], "the key stores one entry"


def test_the_python_example_parks_usage_in_redis_when_postgres_is_down(
        redis_server: str, redis_prefix: str) -> None:
    down = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"  # nothing listens there
    env = {"SLUICE_DATABASE_URL": down, "SLUICE_REDIS_URL": redis_server,
           "SLUICE_REDIS_KEY_PREFIX": redis_prefix, "SLUICE_DATABASE_CONNECT_TIMEOUT_SECONDS": "2"}
    done = python_example(["usage"], env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"outcome": "queued"}
    redis = connect(Settings.from_env({**BASE_ENV, **env}))
    [raw] = redis.lrange(RETRY_QUEUE, 0, -1)
    envelope = RetryEnvelope.parse(raw)
    assert envelope.attempts == 0 and envelope.entry["model"] == "gpt-4.1-mini"


# --- JavaScript ------------------------------------------------------------------------


def test_the_javascript_signer_is_byte_exact_with_sluice() -> None:
    answers = node("console.log(JSON.stringify(input.map(t => { const m = JSON.parse(t); "
                   "return {canonical: app.canonical(m), "
                   "signature: app.sign(m, " + json.dumps(SECRET) + ").signature}; })));",
                   VECTORS)
    signer = Signer([SECRET])
    for text, answer in zip(VECTORS, answers, strict=True):
        message = json.loads(text)
        assert canonical(message).decode("utf-8") == answer["canonical"], text
        assert signer.signature(message) == answer["signature"], text


def test_a_javascript_message_is_what_sluice_publishes() -> None:
    sent = node("const m = app.buildMessage('rss.ingest', input, " + json.dumps(SECRET) + ");"
                "console.log(JSON.stringify(app.sendMessageInput('https://sqs/q', m)));",
                {"sourceId": "src-1", "feedUrl": "https://feeds.example.com/a.xml",
                 "note": "caf\u00e9 \U0001f600"})
    message = json.loads(sent["MessageBody"])
    assert Signer([SECRET]).check(message) is None
    assert list(message)[:5] == ["topic", "batchId", "sourceId", "feedUrl", "publishedAt"]
    assert sent["MessageAttributes"]["idempotencyKey"] == {
        "DataType": "String", "StringValue": idempotency_key(message)}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", message["publishedAt"])


def test_javascript_keys_every_topic_as_sluice_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rss.ingest``'s reference key counting UTF-16 units (an emoji inside the first 96),
    an app topic keyed by a field (the example's, by its user) and one keyed by content."""
    import types

    from sluice.core.extensions import load
    from sluice.extend import Topic
    from sluice.queues import topics

    monkeypatch.syspath_prepend(str(EXAMPLES / "exampleapp"))
    acme = types.ModuleType("acme_ext")
    acme.TOPICS = [Topic("acme.invoice", "acme.work:handler", fields=("invoiceId",))]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "acme_ext", acme)
    cases = [["rss.ingest", {"batchId": "b\U0001f600", "sourceId": "s\U0001f600" * 30}, []],
             ["exampleapp.signup", {"userId": "u-\u00e9", "name": "Ada", "pager": "p"},
              ["userId"]],
             ["acme.invoice", {"invoiceId": "inv-\U0001f600"}, []]]
    sent = node("console.log(JSON.stringify(input.map(([topic, fields, keyed]) => "
                "app.sendMessageInput('https://sqs/q', app.buildMessage(topic, fields, "
                + json.dumps(SECRET) + "), keyed))));", cases)
    keys = []
    for n, answer in enumerate(sent):
        if n == 1:  # the app's topics: the tables as the two app modules make them
            monkeypatch.setattr(topics, "TOPICS", topics.TOPICS.using(
                load(["exampleapp.sluice_ext", "acme_ext"], group=None)))
        message = json.loads(answer["MessageBody"])
        assert Signer([SECRET]).check(message) is None
        keys.append(answer["MessageAttributes"]["idempotencyKey"]["StringValue"])
        assert keys[-1] == idempotency_key(message), message
    assert keys[1] == "exampleapp.signup:u-\u00e9"
    tail = keys[0].split(":", 2)[2]  # an emoji is two UTF-16 units, so two _
    assert len(tail) == 96 and "s__s__s" in tail
    assert keys[2].startswith("acme.invoice:") and len(keys[2]) == len("acme.invoice:") + 64


def run_statements(url: str, statements: list[dict[str, Any]]) -> None:
    """Run the example's statements as an app's driver would, in one transaction: psycopg
    for Postgres (node-postgres numbers its parameters $1…, psycopg names them), sqlite3
    for SQLite (``?`` in order, as better-sqlite3 binds them)."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            for statement in statements:
                conn.execute(statement["text"], statement["values"])
            conn.execute("COMMIT")
        finally:
            conn.close()
        return
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for statement in statements:
            conn.execute(re.sub(r"\$(\d+)", r"%(p\1)s", statement["text"]),
                         {f"p{n}": v for n, v in enumerate(statement["values"], 1)})


def test_javascript_usage_and_delivery_statements_write_what_sluice_reads(db_url: str) -> None:
    dialect = "sqlite" if db_url.startswith("sqlite:") else "postgres"
    entry = {"id": "js-use-1", "tenantId": "t1", "userId": "u1", "model": "gpt-4.1-mini",
             "inputTokens": 104, "outputTokens": 20, "costMicros": 1004,
             "occurredAt": "2026-03-01T12:00:04.000Z"}
    gone = {**entry, "id": "js-use-gone", "tenantId": None, "userId": "u-gone"}
    usage, erased = node(f"console.log(JSON.stringify(input.map(e => app.usageStatements(e, "
                         f"'{dialect}'))));", [entry, gone])
    delivery = node("console.log(JSON.stringify(app.deliveryStatement(input, new Date(), "
                    f"'{dialect}')));",
                    {"channel": "webhook", "recipient": "https://hooks.example.com/x",
                     "payload": {"text": "hello"}, "idempotencyKey": "js:1",
                     "subjectUserId": "u1"})
    envelope = node("console.log(JSON.stringify(app.retryEnvelope(input, 'connect timeout')));",
                    entry)
    db = open_database(db_url)
    try:
        with db.transaction() as tx:
            tx.execute("INSERT INTO erasure_tombstones (subject_user_id, request_id, erased_at) "
                       "VALUES ('u-gone', 'r-1', :now)", {"now": datetime.now(UTC)})
        for _ in range(2):  # twice: idempotent
            run_statements(db_url, usage)
            run_statements(db_url, erased)
            run_statements(db_url, [delivery])
        with db.transaction() as tx:
            ledger = tx.fetchall("SELECT id, occurred_at FROM ai_usage_ledger")
            outbox = tx.fetchall("SELECT id, external_customer_id, status, metadata "
                                 "FROM ai_usage_metering_outbox")
        [queued] = DeliveryStore(db).list(status=DeliveryStatus.PENDING, channel=None,
                                          limit=10)
        written = write_entries(db, [UsageEntry.from_contract(entry)])  # Sluice's own write
    finally:
        db.close()
    assert ledger == [{"id": "js-use-1",
                       "occurred_at": datetime(2026, 3, 1, 12, 0, 4, tzinfo=UTC)}]
    assert outbox == [{"id": "js-use-1:metering", "external_customer_id": "t1",
                       "status": "pending", "metadata": {
                           "model": "gpt-4.1-mini", "input_tokens": 104, "output_tokens": 20,
                           "total_tokens": 124, "cost_micros": 1004, "ledger_id": "js-use-1"}}]
    assert written.inserted == set(), "Sluice sees the JavaScript row as its own"
    assert queued.payload == {"text": "hello"} and queued.subject_user_id == "u1"
    assert queued.next_attempt_at <= datetime.now(UTC)
    parsed = RetryEnvelope.parse(envelope)
    assert UsageEntry.from_contract(parsed.entry).occurred_at == datetime(
        2026, 3, 1, 12, 0, 4, tzinfo=UTC)
    assert parsed.last_error == "connect timeout"


@pytest.fixture
def served(sqlite_url: str, make_services: Any) -> Iterator[tuple[str, Any]]:
    services = make_services(sqlite_url)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(create_app(services), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", services
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def test_a_javascript_app_requests_an_erasure_over_the_api(served: tuple[str, Any]) -> None:
    base, services = served
    token = mint_token(services.settings, ["privacy"], subject="app:account-deleted")
    body = node("console.log(JSON.stringify(await app.requestErasure(input.base, input.token, "
                "'u-js')));", {"base": base, "token": token})
    assert body["status"] == "requested" and body["requestedBy"] == "app:account-deleted"
    assert ErasureStore(services.db).get(body["id"]).subject_user_id == "u-js"


def test_the_guide_names_only_the_stable_api() -> None:
    import sluice

    text = (ROOT / "docs" / "integration.md").read_text()
    # the API as code names it (a file such as ``./.sluice/sluice.db`` is not a name)
    named = set(re.findall(r"(?<![\w/.-])sluice\.(\w+)", text))
    stable = {*sluice.__all__, "extend"}  # sluice.extend: the other public module (api.md)
    assert named and named <= stable, named - stable


# --- the local push endpoint -------------------------------------------------------------


@pytest.fixture
def sluice_dev(sqlite_url: str) -> Iterator[str]:
    """``sluice dev`` as a developer runs it, on its own port and database."""
    base, proc = start_dev({**BASE_ENV, "SLUICE_DATABASE_URL": sqlite_url,
                            "SLUICE_QUEUE_SIGNING_SECRET": SECRET}, ROOT, "--no-scheduler")
    try:
        yield base
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_a_javascript_producer_pushes_through_sluice_dev(sluice_dev: str,
                                                         sqlite_url: str) -> None:
    """The JavaScript example's message reaches the topic's consumer at sluice dev's route,
    verified as the queue's consumer verifies it: a forged one is quarantined and
    acknowledged, a repeat is a duplicate. The oracle is the store the consumer writes."""
    pushed = node("const good = app.buildMessage('rss.ingest', {sourceId: 'src-js'}, "
                  f"{json.dumps(SECRET)});"
                  "const forged = app.buildMessage('rss.ingest', {sourceId: 'src-evil'}, "
                  "'not-the-secret-0123456789');"
                  "const out = [];"
                  "for (const m of [good, good, forged]) "
                  "out.push(await app.pushMessage(input.base, m));"
                  "console.log(JSON.stringify(out));", {"base": sluice_dev})
    assert [(p["status"], p["body"]["outcome"]) for p in pushed] == [
        (200, "done"), (200, "duplicate"), (200, "rejected")], pushed
    assert pushed[2]["body"]["reason"] == "signature does not match"
    db = open_database(sqlite_url)
    try:
        with db.transaction() as tx:
            done = tx.fetchall("SELECT topic, message_id FROM queue_completed_keys")
            quarantined = tx.fetchall("SELECT topic, reason, body FROM queue_quarantine")
    finally:
        db.close()
    assert done == [{"topic": "rss.ingest", "message_id": pushed[0]["body"]["messageId"]}]
    [kept] = quarantined
    assert kept["topic"] == "rss.ingest" and "src-evil" in kept["body"]
    malformed = httpx.post(f"{sluice_dev}/api/queues/rss/ingest", content=b"[1]")
    assert malformed.status_code == 200 and malformed.json()["outcome"] == "rejected"
    assert httpx.post(f"{sluice_dev}/api/queues/no/such", content=b"{}").status_code == 404
    huge = httpx.post(f"{sluice_dev}/api/queues/rss/ingest", content=b" " * 300_000)
    assert huge.status_code == 400 and huge.json()["error"]["field"] == "body"
    deep = httpx.post(f"{sluice_dev}/api/queues/rss/ingest", content=b"[" * 5000)
    assert deep.status_code == 400, "refused at the door, before any parser"


def test_the_guide_push_outcome_table_is_the_code() -> None:
    from sluice.http.push import STATUS_OF

    text = (ROOT / "docs" / "integration.md").read_text()
    rows = {cells[0].strip("` "): int(cells[1]) for line in text.splitlines()
            if line.startswith("| `") and len(cells := line.strip("| ").split(" | ")) == 3
            and cells[1].isdigit()}
    assert rows == {outcome.value: status for outcome, status in STATUS_OF.items()}
