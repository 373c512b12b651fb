"""The delivery queue's behaviours the reference documents describe ([queue], [pipeline])
through the operator's surfaces: the admin delivery routes and ``/api/queue/status`` (the
app in process), the drain's cron route, and the ``sluice`` command line (an app's own
channel among them), on SQLite and Postgres; docs/seed-parity.md names these tests."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.http.app import create_app
from sluice.store.db import open_database
from tests.conftest import BASE_ENV, CRON_SECRET, admin_token, run_cli
from tests.integration.delivery.helpers import WEBHOOK_SECRET, due_now
from tests.providers.telegram import MAX_TEXT as TELEGRAM_MAX
from tests.providers.telegram import TelegramStandIn
from tests.providers.webhook import WebhookReceiver

BASE = "/api/admin/delivery"
CRON = {"authorization": f"Bearer {CRON_SECRET}"}


def ops() -> dict[str, str]:
    """Minted per request: a token minted at import expires on a slow run."""
    return {"authorization": f"Bearer {admin_token(['ops'], subject='ops-1')}"}


@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    with WebhookReceiver(WEBHOOK_SECRET) as receiver:
        yield receiver


@pytest.fixture
def telegram() -> Iterator[TelegramStandIn]:
    with TelegramStandIn(chats=("1001",)) as stand_in:
        yield stand_in


# rates wide enough never to hold a send back: the limiter has its own tests
WIDE = {"SLUICE_TELEGRAM_CHAT_RATE_PER_SECOND": "1000",
        "SLUICE_WEBHOOK_HOST_RATE_PER_SECOND": "10000",
        "SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS": "5",
        "SLUICE_WEBHOOK_SIGNING_SECRET": WEBHOOK_SECRET,
        "SLUICE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1"}


@pytest.fixture
def env(db_url: str, telegram: TelegramStandIn) -> dict[str, str]:
    """The command line's environment: the app's own, plus the database's URL."""
    return {**BASE_ENV, **WIDE, "SLUICE_DATABASE_URL": db_url,
            "SLUICE_TELEGRAM_BOT_TOKEN": telegram.token, "SLUICE_TELEGRAM_API_URL": telegram.url}


@pytest.fixture
def svc(db_url: str, telegram: TelegramStandIn,
        make_services: Callable[..., Services]) -> Services:
    return make_services(db_url, **WIDE, SLUICE_TELEGRAM_BOT_TOKEN=telegram.token,
                         SLUICE_TELEGRAM_API_URL=telegram.url)


@pytest.fixture
def client(svc: Services) -> TestClient:
    """The app in process, its errors answered as a client sees them."""
    return TestClient(create_app(svc), raise_server_exceptions=False)


def cron_drain(client: TestClient) -> dict[str, Any]:
    answer = client.get(f"{BASE}/drain", headers=CRON)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def enqueue(client: TestClient, channel: str, recipient: str, text: str) -> dict[str, Any]:
    stored = client.post(f"{BASE}/entries", headers=ops(), json={
        "channel": channel, "recipient": recipient, "payload": {"text": text}})
    assert stored.status_code == 201, stored.text
    body: dict[str, Any] = stored.json()
    return body


def test_a_failed_entry_is_listed_for_review_redriven_afresh_and_sent_by_the_next_cron_run(
        client: TestClient, svc: Services, env: dict[str, str], webhook: WebhookReceiver) -> None:
    webhook.scripts["/hooks/review"] = [500] * 15
    entry = enqueue(client, "webhook", f"{webhook.http.url}/hooks/review", "disk full")
    assert (entry["status"], entry["attempts"]) == ("pending", 0)

    first = cron_drain(client)

    # /api/queue/status: the depth, what waits in its backoff, and the last run's summary
    status = client.get("/api/queue/status", headers=ops()).json()
    assert status["depth"]["pending"] == 1 and status["inBackoff"] == 1
    assert status["lastSummary"]["summary"] == first
    answers = [first]
    for _ in range(4):
        due_now(svc)
        answers.append(cron_drain(client))
    assert [a["skippedMaxRetries"] for a in answers] == [0, 0, 0, 0, 1]
    last = client.get("/api/queue/status", headers=CRON).json()["lastSummary"]
    assert (last["outcome"], last["summary"]["skippedMaxRetries"]) == ("failures", 1)

    # flagged for review: the failed list and the dead-letter lists show it
    listed = client.get(f"{BASE}/entries", params={"status": "failed"}, headers=ops()).json()
    [failed] = listed["entries"]
    assert (failed["id"], failed["failureReason"], failed["attempts"]) == (
        entry["id"], "max_attempts", 5)
    letters = client.get("/api/admin/dlq/delivery", headers=ops()).json()
    assert [item["id"] for item in letters["items"]] == [entry["id"]]

    # an operator's retry starts it over, and the next cycle picks it up
    webhook.scripts.clear()
    redriven = client.post(f"{BASE}/entries/{entry['id']}/redrive", headers=ops()).json()
    assert (redriven["status"], redriven["attempts"], redriven["lastError"]) == (
        "pending", 0, None)
    assert cron_drain(client)["recovered"] == 1
    shown = client.get(f"{BASE}/entries/{entry['id']}", headers=ops()).json()
    assert (shown["status"], shown["attempts"]) == ("acked", 1)

    # the same from the command line
    webhook.scripts["/hooks/again"] = [422]
    other = enqueue(client, "webhook", f"{webhook.http.url}/hooks/again", "refused once")
    assert cron_drain(client)["failed"] == 1
    done = run_cli(["delivery", "redrive", other["id"], "--by", "oncall", "--json"], env)
    assert done.returncode == 0, done.stderr
    again = json.loads(done.stdout)
    assert (again["status"], again["attempts"], again["lastError"]) == ("pending", 0, None)
    assert cron_drain(client)["recovered"] == 1
    assert DeliveryStore(svc.db).get(other["id"]).status is DeliveryStatus.ACKED


def test_the_inline_send_and_the_drain_go_through_one_path_and_settle_a_refusal_alike(
        client: TestClient, svc: Services, env: dict[str, str],
        telegram: TelegramStandIn) -> None:
    paragraph = "Disk <sda1> & <sdb1> at 97 % on **db-1**. " * 30
    long = "\n\n".join(f"{n}: {paragraph.strip()}" for n in range(6))
    sent = run_cli(["delivery", "enqueue", "telegram", "1001", "--text", long, "--send",
                    "--json"], env)
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["status"] == "acked"
    inline = list(telegram.messages)
    assert len(inline) >= 2 and all(len(m["text"]) <= TELEGRAM_MAX for m in inline)
    assert all(m["parse_mode"] == "HTML" for m in inline) and "<b>db-1</b>" in inline[0]["raw"]

    refusal = (400, {"ok": False, "error_code": 400, "description": "Bad Request: user not found"})
    telegram.script.append(refusal)
    refused = run_cli(["delivery", "enqueue", "telegram", "1001", "--text", "x", "--send",
                       "--json"], env)
    assert refused.returncode == 2, "a permanent failure on the inline path exits 2"
    by_hand = json.loads(refused.stdout)
    telegram.script.append(refusal)
    queued = enqueue(client, "telegram", "1001", "x")
    assert cron_drain(client)["failed"] == 1
    by_drain = client.get(f"{BASE}/entries/{queued['id']}", headers=ops()).json()

    for entry in (by_hand, by_drain):
        assert (entry["status"], entry["failureReason"], entry["attempts"]) == (
            "failed", "permanent", 1)
    assert by_hand["lastError"] == by_drain["lastError"] == (
        "PermanentDeliveryError: telegram 400: Bad Request: user not found")


def test_migrate_makes_the_partial_index_of_active_entries_on_status_and_due_time(
        env: dict[str, str], tmp_path: Path) -> None:
    fresh = {**env, "SLUICE_DATABASE_URL": f"sqlite:///{tmp_path / 'fresh.db'}"}
    for target in (fresh, env):
        done = run_cli(["migrate"], target)
        assert done.returncode == 0, done.stderr
        db = open_database(target["SLUICE_DATABASE_URL"])
        try:
            with db.transaction() as tx:
                if db.dialect == "sqlite":
                    [row] = tx.fetchall("SELECT sql AS def FROM sqlite_master "
                                        "WHERE name = 'delivery_queue_active_idx'")
                else:
                    [row] = tx.fetchall("SELECT indexdef AS def FROM pg_indexes "
                                        "WHERE indexname = 'delivery_queue_active_idx'")
        finally:
            db.close()
        definition = " ".join(str(row["def"]).split()).lower()
        assert "(status, next_attempt_at)" in definition, definition
        assert "where" in definition and "'pending'" in definition
        assert "'in_flight'" in definition and "'acked'" not in definition


APP_EXT = '''
from sluice.extend import Channel


def _build(settings, outbound, retrier):
    from parityapp.raiser import Raiser

    return Raiser()


def _check(value, field):
    return value


CHANNELS = [Channel("parity-raise", "a case name", _build, check=_check)]
'''

APP_RAISER = '''
from sluice.core.errors import ConfigurationError


def chain(levels, bottom):
    """``bottom`` under ``levels`` wrappers, each raised from the one below it."""
    error = RuntimeError(bottom)
    for n in range(levels):
        try:
            raise error
        except RuntimeError as below:
            try:
                raise RuntimeError(f"wrapper {n}") from below
            except RuntimeError as above:
                error = above
    return error


def context():
    try:
        raise RuntimeError("chat_id is empty")
    except RuntimeError:
        try:
            raise RuntimeError("the send failed")
        except RuntimeError as error:
            return error


def suppressed():
    try:
        raise RuntimeError("chat_id is empty")
    except RuntimeError:
        try:
            raise RuntimeError("the send failed") from None
        except RuntimeError as error:
            return error


def cycle():
    first, second = RuntimeError("reset"), RuntimeError("reset again")
    first.__cause__, second.__cause__ = second, first
    return first


CASES = {
    "cause": lambda: chain(1, "user not found"),
    "context": context,
    "suppressed": suppressed,
    "group": lambda: ExceptionGroup("sends", [OSError("connection reset"),
                                              RuntimeError("no conversation reference found")]),
    "cycle": cycle,
    "nine-below": lambda: chain(9, "ambiguous recipient"),
    "ten-below": lambda: chain(10, "ambiguous recipient"),
    "config": lambda: ConfigurationError("the pager's region is not set"),
    "memory": lambda: MemoryError(),
}


class Raiser:
    name = "parity-raise"

    def send(self, entry, progress=None):
        raise CASES[entry.recipient]()
'''


@pytest.fixture
def app_env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """An app whose channel's adapter raises, by recipient, an error graph it built itself."""
    package = tmp_path / "app" / "parityapp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sluice_ext.py").write_text(textwrap.dedent(APP_EXT))
    (package / "raiser.py").write_text(textwrap.dedent(APP_RAISER))
    return {**env, "SLUICE_APP": "parityapp.sluice_ext", "PYTHONPATH": str(tmp_path / "app")}


def test_an_apps_adapter_errors_are_judged_through_their_whole_graph(
        app_env: dict[str, str], svc: Services) -> None:
    store = DeliveryStore(svc.db)
    verdicts = {"cause": "failed", "context": "failed", "suppressed": "pending",
                "group": "failed", "cycle": "pending", "nine-below": "failed",
                "ten-below": "pending", "config": "pending"}
    ids = {case: store.enqueue("parity-raise", case, {"text": case})[0].id for case in verdicts}

    ran = run_cli(["run", "delivery-drain", "--json"], app_env)

    assert ran.returncode == 2, ran.stderr  # the run reported failures
    result = json.loads(ran.stdout)
    assert result["failed"] == 4 and result["fatal"] == 0
    for case, status in verdicts.items():
        entry = store.get(ids[case])
        assert entry.status.value == status, (case, entry.last_error)
        if status == "failed":
            assert entry.failure_reason == "permanent", case
        else:  # transient: nothing judged the entry, so it waits, no attempt counted
            assert entry.attempts == 0, case

    memory, _ = store.enqueue("parity-raise", "memory", {"text": "memory"})
    stopped = run_cli(["run", "delivery-drain", "--json"], app_env)
    assert json.loads(stopped.stdout)["fatal"] == 1, stopped.stderr
    held = store.get(memory.id)
    assert (held.status, held.attempts) == (DeliveryStatus.PENDING, 0), "fatal: the run stops"
