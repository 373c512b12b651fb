"""The simulator's judge and world, without running Sluice: the bounds the invariants apply,
and the same world from the same seed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bench.simulate.invariants import Judge
from bench.simulate.peers import Feed, FeedStory, Network, Receipt
from bench.simulate.world import generate

T0 = datetime(2026, 1, 5, tzinfo=UTC)


def _receipt(hours: float, channel: str = "telegram", late: bool = False,
             key: str | None = None) -> Receipt:
    return Receipt(T0 + timedelta(hours=hours), channel, "-100", 7, key, late)


def test_a_second_copy_to_a_chat_is_a_violation() -> None:
    judge = Judge(T0)
    judge.receipt(_receipt(1))
    assert judge.violations == []
    judge.receipt(_receipt(200))
    assert [v.invariant for v in judge.violations] == ["at_most_once"]
    assert judge.violations[0].day == pytest.approx(200 / 24)


def test_an_unknown_outcome_allows_the_documented_resend_and_no_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLUICE_DELIVERY_UNKNOWN_RESENDS", raising=False)
    judge = Judge(T0)
    judge.receipt(_receipt(1, late=True))
    judge.receipt(_receipt(2, late=True))
    assert judge.violations == []
    judge.receipt(_receipt(3))
    assert [v.invariant for v in judge.violations] == ["at_most_once"]
    assert "unknown outcome" in judge.violations[0].detail


def test_a_webhook_counts_idempotency_keys_and_a_redrive_allows_one_more() -> None:
    judge = Judge(T0)
    judge.receipt(_receipt(1, channel="webhook", key="k1"))
    judge.receipt(_receipt(2, channel="webhook", key="k1"))
    assert judge.violations == []
    judge.redriven(("telegram", "-100", 7))
    judge.receipt(_receipt(3))
    judge.receipt(_receipt(4))
    assert judge.violations == []
    judge.receipt(_receipt(5, channel="webhook", key="k2"))
    assert [v.invariant for v in judge.violations] == ["at_most_once"]


def test_nothing_purged_or_failed_comes_back_and_owed_matches_are_checked() -> None:
    judge = Judge(T0)
    judge.final[("telegram", "-100", 7)] = (T0, "purged by the operator")
    judge.receipt(_receipt(1))
    assert [v.invariant for v in judge.violations] == ["nothing_comes_back"]
    judge.owed(("slack", "C1", 9), T0 + timedelta(hours=3), T0)
    judge.run_ended("delivery-drain", T0, 61.0, 60)
    judge.bounded(T0, {"job_runs": 100}, {"job_runs": 301})
    assert [v.invariant for v in judge.violations][1:] == [
        "eventually_once", "run_within_deadline", "bounded_tables"]


def test_the_same_seed_draws_the_same_world_and_another_seed_another() -> None:
    def shape(seed: int) -> object:
        world = generate(seed, T0, 30)
        return ([(f.name, f.windows, f.stories) for f in world.feeds.values()],
                [(r.rule_id, r.channel, r.recipient, r.versions) for r in world.rules()],
                world.operator_at)

    assert shape(11) == shape(11)
    assert shape(11) != shape(12)


def test_feeds_answer_304_to_their_etag_and_chats_record_late_messages() -> None:
    import httpx

    moments = [T0]
    network = Network(lambda: moments[0], lambda s: moments.__setitem__(
        0, moments[0] + timedelta(seconds=s)))
    network.feeds["feed-0"] = Feed("feed-0", stories=[FeedStory(1, T0, ("kw01", "data"))])
    with httpx.Client(transport=httpx.MockTransport(network.handle)) as client:
        first = client.get("http://127.0.0.1:7001/feed-0.xml")
        assert b"story-1" in first.content
        again = client.get("http://127.0.0.1:7001/feed-0.xml",
                           headers={"if-none-match": first.headers["etag"]})
        assert again.status_code == 304
        from bench.simulate.peers import Peer, Window

        network.destinations["telegram:-5"] = Peer(
            "telegram:-5", [Window(T0, T0 + timedelta(hours=1), "late")])
        with pytest.raises(httpx.ReadTimeout):
            client.post("http://127.0.0.1:7002/botX/sendMessage",
                        json={"chat_id": "-5", "text": "story-1"}, timeout=10.0)
        with pytest.raises(httpx.ConnectError):  # never dialled: not a simulated host
            client.get("http://10.0.0.1/")
    assert [(r.story, r.late) for r in network.receipts] == [(1, True)]
    assert moments[0] == T0 + timedelta(seconds=10)
    assert network.refused_hosts == ["10.0.0.1:None"]


def test_a_table_kept_longer_than_30_days_is_bounded_by_its_retention() -> None:
    """The run log keeps 90 days: at the end it holds three times the days it held at day
    30, so its factor is three times larger (seed 15 x 365: 2,336 runs against 762)."""
    judge = Judge(T0)
    judge.bounded(T0, {"job_runs": 762}, {"job_runs": 2336}, kept_days={"job_runs": 90})
    assert judge.violations == []
    judge.bounded(T0, {"job_runs": 762}, {"job_runs": 762 * 9 + 1}, kept_days={"job_runs": 90})
    assert [v.invariant for v in judge.violations] == ["bounded_tables"]


def _request(seconds: float, answer: str = "up", *, channel: str = "slack",
             recipient: str = "C1", story: int = 7, retry_after_s: float | None = None,
             timeout_s: float | None = None) -> object:
    from bench.simulate.pacing import Request

    return Request(T0 + timedelta(seconds=seconds), channel, recipient, story, answer,
                   retry_after_s, timeout_s)


def test_a_rate_is_kept_with_one_on_the_windows_edge_and_no_more() -> None:
    from bench.simulate.pacing import Pacing

    judge = Judge(T0)
    pacing = Pacing(judge)
    # one message's in-process retries are not two messages (no spacing), but a window
    # of the limit's period holds at most the limit and the one on its edge
    for moment in (0.0, 0.3):
        pacing.request(_request(moment))  # type: ignore[arg-type]
    assert judge.violations == []
    pacing.request(_request(0.9))  # type: ignore[arg-type]
    assert [v.invariant for v in judge.violations] == ["rate_kept"]


def test_messages_to_a_key_are_never_closer_than_its_interval() -> None:
    from bench.simulate.pacing import Pacing

    judge = Judge(T0)  # a Slack channel: one a second
    pacing = Pacing(judge)
    for moment, story in ((0.0, 1), (1.0, 2), (2.5, 3)):
        pacing.request(_request(moment, story=story))  # type: ignore[arg-type]
    assert judge.violations == []
    pacing.request(_request(3.2, story=4))  # type: ignore[arg-type]
    assert [v.invariant for v in judge.violations] == ["spacing_kept"]
    assert "0.70 s after story-3" in judge.violations[0].detail
    group = Judge(T0)  # a Telegram group: 20 a minute, so 3 s apart
    pacing = Pacing(group)
    for n in range(21):
        pacing.request(_request(n * 3.0, channel="telegram", recipient="-100",  # type: ignore[arg-type]
                                story=n))
    assert group.violations == []
    pacing.request(_request(61.0, channel="telegram", recipient="-100", story=99))  # type: ignore[arg-type]
    assert [v.invariant for v in group.violations] == ["spacing_kept"]
    down = Judge(T0)  # a refused connection reached no one: it spaces nothing
    pacing = Pacing(down)
    pacing.request(_request(0.0, "down", story=1))  # type: ignore[arg-type]
    pacing.request(_request(0.0, story=2))  # type: ignore[arg-type]
    assert down.violations == []


def test_every_request_is_given_the_whole_send_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.simulate.pacing import Pacing

    monkeypatch.delenv("SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS", raising=False)
    judge = Judge(T0)
    pacing = Pacing(judge)
    pacing.request(_request(0.0, "late", timeout_s=10.0))  # type: ignore[arg-type]
    assert judge.violations == [] and judge.unknown_sends[("slack", "C1", 7)] == 1
    pacing.request(_request(20.0, timeout_s=3.5, story=8))  # type: ignore[arg-type]
    assert [v.invariant for v in judge.violations] == ["timeout_kept"]
    assert "3.5 s to answer" in judge.violations[0].detail


def test_an_unknown_outcome_may_rest_only_after_the_documented_resends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.simulate.invariants import may_rest_unknown

    monkeypatch.delenv("SLUICE_DELIVERY_UNKNOWN_RESENDS", raising=False)
    assert not may_rest_unknown("telegram", 0, 9)  # nothing unknown: nothing may rest
    assert not may_rest_unknown("telegram", 1, 1)  # one resend is still owed
    assert may_rest_unknown("telegram", 2, 2)
    assert not may_rest_unknown("webhook", 2, 2)  # a webhook is resent to its fifth attempt
    assert not may_rest_unknown("webhook", 4, 4)
    assert may_rest_unknown("webhook", 1, 5)
    monkeypatch.setenv("SLUICE_DELIVERY_UNKNOWN_RESENDS", "2")
    assert not may_rest_unknown("slack", 2, 2)


def test_a_failing_destination_is_asked_again_only_on_the_documented_schedule() -> None:
    from bench.simulate.pacing import Pacing

    judge = Judge(T0)
    pacing = Pacing(judge)
    # one send: three in-process attempts (300 ms doubling), then the queue's 5 s step
    for moment in (0.0, 0.3, 0.9, 5.9, 6.2, 6.8):
        pacing.request(_request(moment, "down"))  # type: ignore[arg-type]
    assert judge.violations == []
    pacing.request(_request(12.0, "down"))  # type: ignore[arg-type]  # the 25 s step
    assert [v.invariant for v in judge.violations] == ["schedule_kept"]
    assert "waits 25 s" in judge.violations[0].detail
    asked = Judge(T0)  # a 429 that asks for a minute is honoured, whatever the step
    pacing = Pacing(asked)
    pacing.request(_request(0.0, "ratelimit", retry_after_s=60))  # type: ignore[arg-type]
    pacing.request(_request(61.0, "ratelimit", retry_after_s=60))  # type: ignore[arg-type]
    assert asked.violations == []
    pacing.request(_request(75.0, "up"))  # type: ignore[arg-type]
    assert [v.invariant for v in asked.violations] == ["schedule_kept"]
    paced = Judge(T0)  # hours of honoured 429s are pacing: the first refusal is failure 1
    pacing = Pacing(paced)
    for moment, answer, wait in ((0.0, "ratelimit", 3600), (3600.0, "ratelimit", 676),
                                 (4276.0, "down", None), (4276.3, "down", None),
                                 (4276.9, "down", None), (4336.0, "down", None),
                                 (4336.3, "down", None), (4336.9, "down", None),
                                 (4370.0, "down", None)):  # failures 1, 2 and 3: 5 s, 25 s
        pacing.request(_request(moment, answer, retry_after_s=wait))  # type: ignore[arg-type]
    assert paced.violations == []
    pacing.request(_request(4420.0, "down"))  # type: ignore[arg-type]  # after 3: 2 min
    assert [v.invariant for v in paced.violations] == ["schedule_kept"]
    assert "failed send 3 in a row (the schedule waits 120 s" in paced.violations[0].detail
    back = Judge(T0)  # refusals for an hour, then a 429 naming 312 s: asked 360 s later
    pacing = Pacing(back)
    moment = 0.0
    for _ in range(8):  # eight failed sends: the step is 10 minutes by then
        for retry in (0.0, 0.3, 0.9):
            pacing.request(_request(moment + retry, "down"))  # type: ignore[arg-type]
        moment += 601.0
    pacing.request(_request(moment, "ratelimit", retry_after_s=312))  # type: ignore[arg-type]
    for retry in (0.0, 0.3, 0.9):  # up and pacing: its wait, not the refusals' 600 s step
        pacing.request(_request(moment + 360.0 + retry, "down"))  # type: ignore[arg-type]
    assert back.violations == []
    pacing.request(_request(moment + 361.0 + 4.0, "down"))  # type: ignore[arg-type]
    assert [v.invariant for v in back.violations] == ["schedule_kept"], "a new streak: 5 s"
    early = Judge(T0)  # the wait it named still holds
    pacing = Pacing(early)
    pacing.request(_request(0.0, "down"))  # type: ignore[arg-type]
    pacing.request(_request(700.0, "ratelimit", retry_after_s=312))  # type: ignore[arg-type]
    pacing.request(_request(1000.0, "down"))  # type: ignore[arg-type]
    assert [v.invariant for v in early.violations] == ["schedule_kept"]
    reset = Judge(T0)  # an answer starts the schedule over; a backlog's next entry is its own
    pacing = Pacing(reset)
    for moment, answer, story in ((0.0, "down", 1), (0.3, "down", 1), (0.9, "down", 1),
                                  (5.9, "up", 1), (5.9, "down", 2), (5.9, "down", 3)):
        pacing.request(_request(moment, answer, story=story))  # type: ignore[arg-type]
    assert reset.violations == []


def test_a_match_a_fault_delayed_is_owed_after_the_recovery_unless_it_rests_unknown() -> None:
    judge = Judge(T0)
    judge.owed(("slack", "C1", 9), T0 + timedelta(hours=30), T0, delayed=True, resting=True)
    assert judge.violations == []
    judge.owed(("slack", "C1", 9), T0 + timedelta(hours=30), T0, delayed=True)
    assert [v.invariant for v in judge.violations] == ["owed_after_recovery"]


def test_a_story_published_during_an_outage_is_owed_after_it_not_excused() -> None:
    from bench.simulate.invariants import LIVENESS_AFTER, owed_matches
    from bench.simulate.peers import Window

    world = generate(3, T0, 30)
    rule = next(r for r in world.rules() if r.channel == "slack" or r.channel == "telegram")
    owed = {match: (due, delayed) for due, match, _, delayed in owed_matches(world, rule)}
    assert owed
    match, (due, _delayed) = next((m, d) for m, d in owed.items() if not d[1])
    story = next(s for f in world.feeds.values() for s in f.stories if s.number == match[2])
    assert due == story.published + LIVENESS_AFTER
    # the same world with the destination down for ten hours over the story: owed later
    down = Window(story.published - timedelta(hours=1), story.published + timedelta(hours=9),
                  "down")
    world.destinations[f"{rule.channel}:{rule.recipient}"].windows.append(down)
    later = {m: (d, late) for d, m, _, late in owed_matches(world, rule)}
    assert later[match][1] is True
    assert later[match][0] >= down.end + LIVENESS_AFTER


def test_a_flush_stops_after_three_failing_answers_in_a_row_and_at_a_429() -> None:
    from bench.simulate.billing import Billing

    judge = Judge(T0)
    billing = Billing(judge, None, None, lambda line: None)
    billing.polar_request("error")  # no run under way: not judged
    billing.flush_started()
    for answer in ("error", "late", "down", "up", "error", "error", "error"):
        billing.polar_request(answer)
    billing.flush_ended(T0)
    assert judge.violations == []
    billing.flush_started()
    for answer in ("error", "error", "error", "error"):
        billing.polar_request(answer)
    billing.flush_ended(T0)
    assert [v.invariant for v in judge.violations] == ["metering_paced"]
    assert "4 times in a row" in judge.violations[0].detail
    after = Judge(T0)
    billing = Billing(after, None, None, lambda line: None)
    billing.flush_started()
    for answer in ("up", "ratelimit", "up"):
        billing.polar_request(answer)
    billing.flush_ended(T0)
    assert [v.invariant for v in after.violations] == ["metering_paced"]
    assert "after a 429" in after.violations[0].detail


def test_a_webhook_receiver_refuses_what_fails_its_standard_webhooks_check() -> None:
    import json

    import httpx

    from bench.simulate.peers import Peer
    from sluice.core.webhooks import sign  # the sender's side: the receiver's check agrees

    network = Network(lambda: T0, lambda s: None)
    network.hook_secret = b"a-shared-secret-of-24-chars!"
    network.destinations["webhook:hook-0-1"] = Peer("webhook:hook-0-1")
    body = json.dumps({"payloads": ["story-3"]}).encode()
    now = int(T0.timestamp())

    def post(stamp: int, key: str = "k1", secret: str = "a-shared-secret-of-24-chars!"
             ) -> int:
        headers = {"content-type": "application/json", "idempotency-key": "k1",
                   **sign([secret], key, stamp, body)}
        with httpx.Client(transport=httpx.MockTransport(network.handle)) as client:
            return client.post("http://127.0.0.1:7101/hook-0-1", content=body,
                               headers=headers).status_code

    assert post(now) == 200 and network.unsigned == []
    assert post(now * 1000) == 401  # a timestamp in milliseconds
    assert post(now, secret="another-secret-of-24-chars!!") == 401
    assert post(now, key="k2") == 401  # signed under an id other than its idempotency key
    assert len(network.unsigned) == 3 and len(network.receipts) == 1


def test_polar_events_must_describe_their_call_as_the_world_made_it() -> None:
    from bench.simulate.billing import Billing
    from bench.simulate.world import UsageCall

    judge = Judge(T0)
    billing = Billing(judge, None, None, lambda line: None)
    call = UsageCall(T0 + timedelta(milliseconds=1500), "c1", "org-a", "user-0-1", 300)
    billing.accepted["c1:metering"] = T0
    billing.calls["c1:metering"] = call
    event = {"name": "ai_usage", "external_customer_id": "org-a", "external_id": "c1:metering",
             "metadata": {"input_tokens": 300, "output_tokens": 100, "total_tokens": 400},
             "timestamp": "2026-01-05T00:00:01.500Z"}
    billing.polar_received(event, T0)
    assert judge.violations == []
    billing.polar_received({**event, "timestamp": "2026-01-05T00:07:00.000Z"}, T0)
    billing.polar_received({**event, "external_customer_id": "user-0-1"}, T0)
    billing.polar_received({**event, "metadata": {**event["metadata"], "output_tokens": 300}},
                           T0)
    assert [v.invariant for v in judge.violations] == ["metered_right"] * 3
    assert "timestamp" in judge.violations[0].detail
    assert "external_customer_id 'user-0-1'" in judge.violations[1].detail
    billing.polar_received({**event, "external_id": "nobody"}, T0)
    assert judge.violations[-1].invariant == "metered_once"


def test_a_feeds_wait_after_a_fault_is_its_whole_failure_streaks() -> None:
    """Sluice's feed backoff doubles from 5 minutes over the failures since the feed was last
    read, so a window that begins inside the wait after the one before continues its
    streak (seed 26 x 365: a day slow, then four hours rate-limited, then a day's wait)."""
    from bench.simulate.invariants import FEED_BACKOFF_MAX, feed_backoff
    from bench.simulate.peers import Window
    from sluice.rss.fetch import DEFAULT_BACKOFF

    assert FEED_BACKOFF_MAX == DEFAULT_BACKOFF.cap
    t0 = datetime(2026, 1, 23, 5, 25, tzinfo=UTC)
    slow = Window(t0, t0 + timedelta(hours=23), "slow")
    limited = Window(t0 + timedelta(hours=41), t0 + timedelta(hours=45), "ratelimit")
    alone = Window(t0 + timedelta(days=9), t0 + timedelta(days=9, hours=2), "down")
    held = feed_backoff([limited, alone, slow])
    # the slow day's own wait: its length
    assert held[0].end == slow.end + timedelta(hours=23, minutes=15)
    # the rate limit began inside that wait: the streak began with the slow window, so the
    # wait after it is capped at a day, not its own four hours
    assert held[1].end == limited.end + FEED_BACKOFF_MAX + timedelta(minutes=15)
    # a window after the feed could be read again starts a streak of its own
    assert held[2].end == alone.end + timedelta(hours=2, minutes=15)


def test_a_full_page_of_failed_entries_hides_the_older_ones_without_losing_them() -> None:
    """The listing shows the newest 500 by enqueue: an entry seen failed and enqueued before
    the page's oldest is not judged gone; one enqueued after it and missing is."""
    from bench.simulate.operator import retention_kept

    t0 = datetime(2026, 1, 5, tzinfo=UTC)
    judge = Judge(t0)
    for entry_id, enqueued in (("old", t0), ("new", t0 + timedelta(hours=2))):
        judge.failed_seen[entry_id] = (t0 + timedelta(hours=3), ("telegram", "1", 1))
        judge.failed_enqueued[entry_id] = enqueued
    retention_kept(judge, t0 + timedelta(days=1), set(), timedelta(days=7),
                   shown_from=t0 + timedelta(hours=1))
    assert [v.detail.split()[0] for v in judge.violations] == ["story-1"]
    assert "old" in judge.failed_seen and "new" not in judge.failed_seen
