"""Replay by destination and window, through the real store, the real drain and the provider
stand-ins, on SQLite and Postgres: what a dry run counts, what the real run makes due, and
what the receiver got (each entry once; nothing it had already acknowledged unless asked).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest

from sluice.core.errors import RequestError
from sluice.core.services import Services
from sluice.delivery.channels import Outbound, build_adapters, channels
from sluice.delivery.chunks import ChunkLog
from sluice.delivery.replay import Replay, ReplayFilter, ReplayReport, exact, parse_filter
from sluice.delivery.store import DeliveryEntry, DeliveryStatus, DeliveryStore, Effect
from sluice.jobs.registry import Deadline
from sluice.store.db import utcnow
from tests.integration.billing.counting import CountingDatabase
from tests.integration.delivery.bulk import insert_failed
from tests.integration.delivery.conftest import WIDE_RATES
from tests.integration.delivery.helpers import Providers, drain_once

HOUR = timedelta(hours=1)


def hook_key(providers: Providers) -> str:
    """The webhook receiver's destination, spelled out as docs/delivery.md names it."""
    return f"webhook:127.0.0.1:{providers.webhook.url.split(':')[2].split('/')[0]}"


@contextmanager
def replayer(svc: Services, batch: int | None = None) -> Iterator[Replay]:
    with Outbound.open(svc.settings) as client:
        yield (Replay.from_services(svc, client) if batch is None
               else Replay.from_services(svc, client, batch=batch))


def replay(svc: Services, destination: str, *, dry_run: bool = False, **values: str
           ) -> ReplayReport:
    since = values.pop("since", None) or (utcnow() - HOUR).isoformat()
    flt = parse_filter({"destination": destination, "since": since, **values},
                       channels=list(channels()))
    with replayer(svc) as r:
        return r.run(flt, dry_run=dry_run)


def set_rows(svc: Services, ids: list[str], **columns: object) -> None:
    assignments = ", ".join(f"{name} = :{name}" for name in columns)
    with svc.db.transaction() as tx:
        for entry_id in ids:
            tx.execute(f"UPDATE delivery_queue SET {assignments} WHERE id = :id",
                       {**columns, "id": entry_id})


def hooks(svc: Services, providers: Providers, n: int, prefix: str,
          **kwargs: object) -> list[DeliveryEntry]:
    store = DeliveryStore(svc.db)
    return [store.enqueue("webhook", providers.webhook.url, {"text": f"{prefix} {i}"},
                          idempotency_key=f"{prefix}-{i}", **kwargs)[0]  # type: ignore[arg-type]
            for i in range(n)]


def sent_since(providers: Providers, mark: int) -> Counter[str]:
    """The keys the receiver was sent after the first ``mark`` requests."""
    return Counter(r["key"] for r in providers.webhook.received[mark:])


def statuses(svc: Services) -> Counter[str]:
    return Counter(e.status.value for e in DeliveryStore(svc.db).list(limit=500))


def statuses_all(svc: Services) -> Counter[str]:
    with svc.db.transaction() as tx:
        rows = tx.fetchall("SELECT status, count(*) AS n FROM delivery_queue GROUP BY status")
    return Counter({row["status"]: int(row["n"]) for row in rows})


def test_a_dry_run_counts_then_the_real_run_sends_each_failed_entry_once(
        svc: Services, providers: Providers) -> None:
    # GIVEN 5 entries the receiver took and 10 it refused for good (a 400 each), all of one
    # destination, and beside them a failed entry of another destination and 2 of this one
    # enqueued two days ago (outside the window; expired since)
    hooks(svc, providers, 5, "took")
    assert drain_once(svc)["recovered"] == 5
    refused = hooks(svc, providers, 10, "refused")
    providers.webhook.answers.extend([400] * 10)
    assert drain_once(svc)["failed"] == 10
    DeliveryStore(svc.db).enqueue("telegram", "1002", {"text": "blocked"})  # bot blocked
    old = hooks(svc, providers, 2, "old", now=utcnow() - timedelta(days=2))
    third = drain_once(svc)  # the blocked chat is disabled: its entry fails apart
    assert (third["failed"], third["failedDisabled"]) == (2, 1)
    before = statuses(svc)
    assert before == {"acked": 5, "failed": 13}
    destination = hook_key(providers)

    # WHEN the operator asks for a dry run
    dry = replay(svc, destination, dry_run=True).to_json()
    # THEN it says 10 would go out and 5 were already acknowledged, and changes nothing
    assert (dry["count"], dry["alreadyAcknowledged"]) == (10, 5)
    assert dry["window"] == {"failed": 10, "expired": 0, "acked": 5, "unknown": 0}
    assert statuses(svc) == before and dry["batches"] == 0

    # WHEN the real run goes, and the drain sends what it made due
    mark = len(providers.webhook.received)
    done = replay(svc, destination)
    assert (done.count, done.already_acknowledged, done.skipped_acknowledged) == (10, 5, 0)
    store = DeliveryStore(svc.db)
    for entry in refused:
        again = store.get(entry.id)
        assert (again.status, again.attempts, again.failure_reason) == (
            DeliveryStatus.PENDING, 0, None), "restarted afresh, as a redrive"
        assert again.started_at is not None and again.started_at > entry.enqueued_at
    assert drain_once(svc)["recovered"] == 10
    # THEN the receiver got each of the 10 exactly once, and nothing else
    assert sent_since(providers, mark) == Counter({e.idempotency_key: 1 for e in refused})
    assert {store.get(e.id).status for e in old} == {DeliveryStatus.FAILED}
    assert statuses(svc) == {"acked": 15, "failed": 3}

    # AND a second replay of the same window finds nothing left to send
    assert replay(svc, destination).count == 0
    assert drain_once(svc)["recovered"] == 0 and sent_since(providers, mark).total() == 10


def test_a_thousand_failed_entries_replay_in_full_a_batch_a_statement(
        providers: Providers, make_services: Callable[..., Services], db_url: str) -> None:
    # four senders at once (the drain's own concern, test_drain_concurrency.py), here only
    # so that 1,000 sends take seconds rather than a minute
    svc = make_services(db_url, **providers.env(), **WIDE_RATES,
                        SLUICE_DELIVERY_DRAIN_CONCURRENCY="4")
    # GIVEN 1,000 failed entries of one destination (failed for good: settled in one write)
    entries = hooks(svc, providers, 1000, "bulk")
    with svc.db.transaction() as tx:
        tx.execute("UPDATE delivery_queue SET status = 'failed', failure_reason = 'permanent', "
                   "failed_at = :now, attempts = 1", {"now": utcnow()})
    flt = parse_filter({"destination": hook_key(providers),
                        "since": (utcnow() - HOUR).isoformat()}, channels=list(channels()))
    pending_after_each_page: list[int] = []

    def count_pending(report: ReplayReport) -> None:
        with svc.db.transaction() as tx:
            row = tx.fetchone("SELECT count(*) AS n FROM delivery_queue "
                              "WHERE status = 'pending'")
        assert row is not None
        pending_after_each_page.append(int(row["n"]))

    # WHEN it is replayed 100 entries a statement
    with replayer(svc, batch=100) as r:
        report = r.run(flt, dry_run=False, progress=count_pending)

    # THEN every one is made due (no cap of 100), each page's restart one statement of at
    # most 100 rows, as the store counts them after each page
    assert (report.count, report.batches, report.largest_batch) == (1000, 10, 100)
    steps = [b - a for a, b in zip([0, *pending_after_each_page], pending_after_each_page,
                                   strict=False)]
    assert max(steps) == 100 and sum(steps) == 1000 and len([s for s in steps if s]) == 10
    # AND the drain sends every one of them, each once
    mark = len(providers.webhook.received)
    delivered = 0
    for _ in range(5):
        delivered += drain_once(svc)["recovered"]
        if delivered == 1000:
            break
    assert delivered == 1000
    assert sent_since(providers, mark) == Counter({e.idempotency_key: 1 for e in entries})


def test_an_entry_whose_key_the_receiver_acknowledged_before_is_left_unless_asked(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    # GIVEN an alert delivered long ago (its entry pruned since, its effect record says acked)
    store.enqueue("webhook", providers.webhook.url, {"text": "alert"}, idempotency_key="alert:1",
                  effect=Effect("alert", "scope", "story-1"))
    assert drain_once(svc)["recovered"] == 1
    with svc.db.transaction() as tx:
        tx.execute("UPDATE delivery_queue SET updated_at = :t", {"t": utcnow() - timedelta(days=60)})
    assert store.prune(utcnow() - timedelta(days=30)) == 1
    # AND an entry under the same key enqueued again since (the API takes any key), failed
    again, created = store.enqueue("webhook", providers.webhook.url, {"text": "alert"},
                                   idempotency_key="alert:1")
    assert created
    providers.webhook.answers.append(400)
    assert drain_once(svc)["failed"] == 1
    mark = len(providers.webhook.received)

    # WHEN the failed entries of the window are replayed
    report = replay(svc, hook_key(providers)).to_json()
    # THEN that one is counted as already acknowledged and left as it is
    assert (report["count"], report["alreadyAcknowledged"], report["skippedAcknowledged"]) == (
        0, 1, 1)
    assert store.get(again.id).status is DeliveryStatus.FAILED
    assert drain_once(svc)["recovered"] == 0 and sent_since(providers, mark).total() == 0
    # (an operator who means it redrives that entry by its id)


def test_unknown_and_expired_entries_are_replayed_only_when_asked(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    destination = hook_key(providers)
    resting = hooks(svc, providers, 2, "unknown")
    set_rows(svc, [e.id for e in resting], status="unknown", attempts=5, unknown_sends=5)
    late = hooks(svc, providers, 3, "late", now=utcnow() - timedelta(hours=30))
    refused = hooks(svc, providers, 1, "refused")
    providers.webhook.answers.append(400)
    summary = drain_once(svc)
    assert (summary["expired"], summary["failed"]) == (3, 4)
    since = (utcnow() - timedelta(days=2)).isoformat()

    # the default (failed) takes every failed entry, expired or not; never the unknown ones
    dry = replay(svc, destination, dry_run=True, since=since).to_json()
    assert dry["count"] == 4
    assert dry["window"] == {"failed": 4, "expired": 3, "acked": 0, "unknown": 2}
    # expired: only those that expired
    mark = len(providers.webhook.received)
    assert replay(svc, destination, since=since, status="expired").count == 3
    assert store.get(refused[0].id).status is DeliveryStatus.FAILED
    assert {store.get(e.id).status for e in resting} == {DeliveryStatus.UNKNOWN}
    assert drain_once(svc)["recovered"] == 3
    assert sent_since(providers, mark) == Counter({e.idempotency_key: 1 for e in late})
    # unknown: when the operator asks for them by name (each sent again, once)
    mark = len(providers.webhook.received)
    asked = replay(svc, destination, since=since, status="unknown")
    assert asked.count == 2
    assert {store.get(e.id).attempts for e in resting} == {0}
    assert drain_once(svc)["recovered"] == 2
    assert sent_since(providers, mark) == Counter({e.idempotency_key: 1 for e in resting})


def test_acked_entries_go_again_only_with_status_acked_and_whole(
        svc: Services, providers: Providers) -> None:
    store = DeliveryStore(svc.db)
    # GIVEN a message of three chunks the chat took, and an acked webhook entry
    chunked, _ = store.enqueue("telegram", "1001", {"payloads": ["one", "two", "three"]})
    took = hooks(svc, providers, 1, "took")
    assert drain_once(svc)["recovered"] == 2
    assert len(ChunkLog(svc.db).accepted(chunked.id)) == 3
    chat = "telegram:1001"

    # WHEN its window is replayed with the default status: nothing goes
    assert replay(svc, chat).to_json()["alreadyAcknowledged"] == 1
    assert replay(svc, chat).count == 0 and store.get(chunked.id).status is DeliveryStatus.ACKED
    # WHEN the operator asks for acked ones: that destination's entry, and only it, goes
    # again, every chunk (the chunks its first send got through are forgotten)
    asked = replay(svc, chat, status="acked").to_json()
    assert (asked["count"], asked["alreadyAcknowledged"]) == (1, 1)
    assert store.get(took[0].id).status is DeliveryStatus.ACKED
    assert ChunkLog(svc.db).accepted(chunked.id) == {}
    assert drain_once(svc)["recovered"] == 1
    assert Counter(m["text"] for m in providers.telegram.messages) == {
        "one": 2, "two": 2, "three": 2}


def test_the_channel_narrows_and_must_have_an_adapter(
        svc: Services, providers: Providers, make_services: Callable[..., Services],
        db_url: str) -> None:
    hooks(svc, providers, 1, "x")
    providers.webhook.answers.append(400)
    drain_once(svc)
    destination = hook_key(providers)
    assert replay(svc, destination, channel="slack").count == 0
    assert replay(svc, destination, channel="webhook", dry_run=True).count == 1
    # a channel whose adapter is not configured names no destination: refused
    bare = make_services(db_url)
    with pytest.raises(RequestError) as refused:
        replay(bare, destination, channel="webhook")
    assert refused.value.context["field"] == "channel" and "no adapter" in refused.value.message
    # without a channel, the entries of unconfigured channels are counted, not matched
    report = replay(bare, destination, dry_run=True).to_json()
    assert (report["count"], report["noAdapter"]) == (0, 1)


def test_the_window_is_enqueue_time_half_open(svc: Services, providers: Providers) -> None:
    at = utcnow() - timedelta(minutes=30)
    inside = hooks(svc, providers, 1, "in", now=at)
    hooks(svc, providers, 1, "edge", now=at + timedelta(minutes=10))
    set_rows(svc, [e.id for e in DeliveryStore(svc.db).list()], status="failed",
             failure_reason="permanent")
    flt = ReplayFilter(hook_key(providers), at, at + timedelta(minutes=10))
    with replayer(svc) as r:
        report = r.run(flt, dry_run=False)
    assert report.count == 1
    assert DeliveryStore(svc.db).get(inside[0].id).status is DeliveryStatus.PENDING


def test_fifty_entries_among_thousands_replay_in_a_handful_of_pages(
        svc: Services, providers: Providers) -> None:
    # GIVEN 50 failed entries to one webhook URL, and in the same window 2,000 failed
    # entries to another URL on the same host and 3,000 to 1,000 chats
    mine = f"{providers.webhook.url}mine"
    other = f"{providers.webhook.url}other"
    others = [("webhook", other)] * 2000 + [("telegram", str(2000 + i % 1000))
                                            for i in range(3000)]
    ids = insert_failed(svc.db, [("webhook", mine)] * 50 + others)
    counted = CountingDatabase(svc.db)
    flt = parse_filter({"destination": f"webhook:{mine}", "since": (utcnow() - HOUR).isoformat()},
                       channels=list(channels()))

    # WHEN that URL's window is replayed, 10 entries a page
    with Outbound.open(svc.settings) as client:
        report = Replay(DeliveryStore(counted), build_adapters(svc.settings, client),
                        batch=10).run(flt, dry_run=False)

    # THEN the 50 are restarted, and the replay read 6 pages of its own entries (5 full and
    # the short one that ends it), not the 5,050 entries of the window
    assert (report.count, report.pages, report.batches) == (50, 6, 5)
    assert counted.statements.count("replay_window") == 6
    assert len(counted.transactions) <= 2 * 6, counted.statements
    store = DeliveryStore(svc.db)
    assert {store.get(i).status for i in ids[:50]} == {DeliveryStatus.PENDING}
    assert statuses_all(svc) == {"pending": 50, "failed": 5000}
    # AND the receiver's key (the host) selects every URL on it: a dry run counts the 2,000
    receiver = replay(svc, hook_key(providers), dry_run=True)
    assert (receiver.count, receiver.window["failed"], receiver.pages) == (2000, 2000, 5)


def test_a_replay_past_its_deadline_answers_the_rest_and_the_rest_completes(
        svc: Services, providers: Providers) -> None:
    # GIVEN 25 failed entries of one chat
    ids = insert_failed(svc.db, [("telegram", "1001")] * 25)
    flt = parse_filter({"destination": "telegram:1001",
                        "since": (utcnow() - HOUR).isoformat()}, channels=list(channels()))
    # WHEN a replay of 10 a page runs with its deadline already reached
    with replayer(svc, batch=10) as r:
        first = r.run(flt, dry_run=False, deadline=Deadline(0))
        # THEN it did one page and answers the rest of the window as the body to send again
        assert (first.count, first.pages) == (10, 1) and first.next is not None
        body = first.to_json()["next"]
        assert set(body) == {"destination", "channel", "since", "until", "status", "after"}
        assert body["until"] == exact(flt.until) and body["after"] == ids[-10]
        # WHEN the rest is asked for, again and again until nothing is left
        counts, rest = [], parse_filter(body, channels=list(channels()))
        while True:
            done = r.run(rest, dry_run=False, deadline=Deadline(0))
            counts.append(done.count)
            if done.next is None:
                break
            rest = parse_filter(done.to_json()["next"], channels=list(channels()))
    # THEN each entry was restarted once, by exactly one of the calls
    assert [first.count, *counts] == [10, 10, 5]
    assert statuses_all(svc) == {"pending": 25}
