"""The delivery policy end to end, judged from what the stand-ins received: an operator's
send-again after days is sent; a Redis outage costs no attempt and no unknown outcome; a
dead receiver ends visibly (expired under its key, the alarm's metric meanwhile); a held
backlog is not churned by the claim. Both backends, real stand-ins, a real Redis."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.delivery.drain import CLAIM_BATCH, report_drained
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.store.db import utcnow
from tests.conftest import free_port
from tests.integration.delivery.helpers import Providers, drain_once, due_now

LEASE = timedelta(minutes=2)


class Metrics(Reporter):
    def __init__(self) -> None:
        super().__init__()
        self.values: list[dict[str, float]] = []

    def metrics(self, values: dict[str, float], unit: str = "Count", **dims: str) -> None:
        self.values.append(values)


def metrics_of(result: dict[str, object]) -> dict[str, float]:
    reporter = Metrics()
    report_drained(result, reporter)  # type: ignore[arg-type]
    [values] = reporter.values
    return values


def backdate(svc: Services, hours: float) -> None:
    """Time travel: every entry was enqueued (and restarted) ``hours`` earlier."""
    with svc.db.transaction() as tx:
        tx.execute("UPDATE delivery_queue SET enqueued_at = :then, "
                   "started_at = CASE WHEN started_at IS NULL THEN NULL ELSE :then END",
                   {"then": utcnow() - timedelta(hours=hours)})


def test_send_again_on_an_entry_resting_unknown_for_two_days_sends_it(
        svc: Services, providers: Providers) -> None:
    # GIVEN a chat message sent two days ago whose answers never came: it rests unknown
    store = DeliveryStore(svc.db)
    then = utcnow() - timedelta(days=2)
    entry, _ = store.enqueue("telegram", "1001", {"text": "resting"}, now=then)
    for minutes in (0, 10):
        at = then + timedelta(minutes=minutes)
        [claimed] = store.claim(LEASE, now=at)
        assert store.request_left(claimed, now=at)
        store.nack(claimed, "read timeout (sent; no answer)", unknown=True, now=at)
    assert store.get(entry.id).status is DeliveryStatus.UNKNOWN

    # WHEN the operator sends it again and the drain runs
    store.send_again(entry.id)
    result = drain_once(svc)

    # THEN it is sent, once, and nothing expired
    assert result["expired"] == 0 and result["recovered"] == 1
    assert [m["text"] for m in providers.telegram.messages] == ["resting"]
    sent = store.get(entry.id)
    assert (sent.status, sent.attempts) == (DeliveryStatus.ACKED, 1)
    assert sent.enqueued_at == then, "the first enqueue is kept; the expiry read the restart"


def test_a_redis_outage_of_eight_runs_costs_no_attempt_and_no_unknown(
        db_url: str, providers: Providers, redis_server: str, redis_prefix: str,
        make_services: Callable[..., Services]) -> None:
    # GIVEN the rates in Redis, and Redis gone (nothing listens on its port) for 8 runs
    redis = {"SLUICE_REDIS_KEY_PREFIX": redis_prefix}
    down = make_services(db_url, **providers.env(), **redis,
                         SLUICE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    store = DeliveryStore(down.db)
    entries = [store.enqueue("webhook", providers.webhook.url, {"text": "hook"})[0],
               store.enqueue("telegram", "1001", {"text": "chat"})[0],
               store.enqueue("slack", "C0ALERTS", {"text": "channel"})[0]]
    for _ in range(8):
        result = drain_once(down)
        # THEN each run puts back what it took, with its attempt, and says why
        assert result["notSent"] == 1 and "redis" in (result["notSentError"] or "")
        assert result["unknown"] == 0 and result["failed"] == 0
        due_now(down)
    for entry in entries:
        waiting = store.get(entry.id)
        assert (waiting.status, waiting.attempts, waiting.unknown_sends) == (
            DeliveryStatus.PENDING, 0, 0)
    assert providers.webhook.received == [] and providers.telegram.messages == []

    # AND once Redis is back, everything is sent, on its first counted attempt
    back = make_services(db_url, **providers.env(), **redis, SLUICE_REDIS_URL=redis_server)
    result = drain_once(back)
    assert result["recovered"] == 3 and result["notSent"] == 0
    assert {store.get(e.id).attempts for e in entries} == {1}
    assert len(providers.webhook.delivered) == 1 and len(providers.telegram.messages) == 1
    assert len(providers.slack.messages) == 1


def test_a_dead_receiver_over_a_day_ends_expired_under_its_key_with_the_alarm_meanwhile(
        svc: Services, providers: Providers) -> None:
    # GIVEN a webhook receiver that is down all day, three entries waiting on it
    providers.webhook.answers.extend([503] * 1000)
    store = DeliveryStore(svc.db)
    entries = [store.enqueue("webhook", providers.webhook.url, {"text": str(n)})[0]
               for n in range(3)]
    key = f"webhook:127.0.0.1:{providers.webhook.url.split(':')[2].split('/')[0]}"

    # WHEN the day's runs reach its probes (every probe due), then the expiry passes
    down: list[float] = []
    for hour in range(8):
        result = drain_once(svc)
        assert result["failed"] == 0 and result["skippedMaxRetries"] == 0
        down.append(metrics_of(result)["QueueDrained.destinationsDown"])
        backdate(svc, 3 * (hour + 1))
        due_now(svc)
    backdate(svc, 25)
    last = drain_once(svc)

    # THEN the alarm's metric says down from the third failed probe; the first run tries two
    # entries (the second failing before a success is what makes it the receiver's), then
    # each run's probe is one entry's in-process tries, whatever waits behind it
    assert down == [0.0, 0.0] + [1.0] * 6
    assert len(providers.webhook.received) == (2 + 7) * 3
    # AND the end is visible: expired, counted under the key that held them, not as tries
    assert last["expired"] == 3 and last["failed"] == 3 and last["skippedMaxRetries"] == 0
    assert last["expiredWaiting"] == {key: 3}
    assert metrics_of(last)["QueueDrained.expiredWaiting"] == 3.0
    for entry in entries:
        ended = store.get(entry.id)
        assert (ended.status, ended.failure_reason, ended.attempts) == (
            DeliveryStatus.FAILED, "expired", 0)


def _touched(svc: Services, since: datetime) -> int:
    with svc.db.transaction() as tx:
        row = tx.fetchone("SELECT count(*) AS n FROM delivery_queue WHERE updated_at > :since",
                          {"since": since})
    assert row is not None
    return int(row["n"])


def test_a_held_backlog_is_not_churned_by_the_claim(svc: Services, providers: Providers) -> None:
    # GIVEN 60 entries on a dead receiver (the first run found it failing at its second
    # entry, set aside the rest of its claim, and never claimed the others)
    providers.webhook.answers.extend([503] * 1000)
    store = DeliveryStore(svc.db)
    for n in range(60):
        store.enqueue("webhook", providers.webhook.url, {"text": str(n)})
    since = utcnow()
    first = drain_once(svc)
    assert first["outages"]["count"] == CLAIM_BATCH - 1, "the second tried, the rest not sent"
    assert _touched(svc, since) == CLAIM_BATCH, "one claim of the receiver, no more"
    assert {e.attempts for e in store.list(limit=100)} == {0}, "the receiver's: none counted"

    # WHEN five more runs reach its probe, with healthy entries enqueued meanwhile
    for run in range(5):
        store.enqueue("slack", "C0ALERTS", {"text": f"healthy {run}"})
        due_now(svc)
        since = utcnow()
        result = drain_once(svc)
        # THEN each run touches the one probe entry and the healthy one, not the backlog
        assert result["recovered"] == 1 and result["outages"]["count"] == 1
        assert _touched(svc, since) == 2
    assert len(providers.webhook.received) == (2 + 5) * 3, "two in the first run, one probe a run"
