"""One seed: the real Sluice on SQLite, its jobs fired on serverless.yml's schedules by
the simulated clock, against the world and peers the seed generated.

The loop takes the earliest of: a job's next firing (``firing.py``: only firings that can do
something), a rule change, an operator visit, an AI call reported, a crash being armed, an
owed delivery or metering row coming due for its check. Each is one *step*: it is logged
(the last ones are printed with a failure), folded into the history digest, and followed by
the invariants' checks and the re-planning of the firings it may have given work.
"""

from __future__ import annotations

import hashlib
import heapq
import random
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench.simulate.billing import OUTBOX_SUFFIX, Billing, owed_at
from bench.simulate.billing import RETRY_AFTER as USAGE_RETRY
from bench.simulate.charges import SENT_POINTS, Charges
from bench.simulate.clock import SimClock, SimulatedWaits
from bench.simulate.crashes import Crashes, SimCrash
from bench.simulate.deployment import (
    WEBHOOK_SECRET,
    brief,
    passed_settings,
    seeded_ids,
    settings_env,
    simulated_redis,
)
from bench.simulate.erasure import Erasures
from bench.simulate.fairness import Isolation
from bench.simulate.firing import (
    IDLE_EVERY,
    Firing,
    drain_wake,
    erasure_wake,
    outbox_waiting,
    retry_waiting,
    tick_wake,
)
from bench.simulate.hosts import hook_url
from bench.simulate.inline import inline_pools
from bench.simulate.invariants import (
    BOUNDED_TABLES,
    LIVENESS_AFTER,
    STORE_SETTLE,
    Judge,
    Match,
    Violation,
    may_rest_unknown,
    owed_matches,
)
from bench.simulate.limits import reach_limits
from bench.simulate.missed import MissedRuns
from bench.simulate.operator import (
    destination_of,
    honoured,
    keys_of,
    like,
    match_of,
    match_of_like,
    observe_failed,
    visit,
)
from bench.simulate.outages import FlakyRedis, Outages
from bench.simulate.pacing import Pacing
from bench.simulate.peers import (
    FEEDS,
    Installed,
    Network,
    Receipt,
    Window,
)
from bench.simulate.queues import PushQueue
from bench.simulate.rogue import RETENTION_LIKE, Rogue
from bench.simulate.rows import Rows
from bench.simulate.stores import Store, database
from bench.simulate.streaks import Streaks
from bench.simulate.world import HORIZON_DAYS, ErasureCall, SimRule, UsageCall, World, generate

# The gated jobs whose check a step (its kind, or the job that ran) may change.
TOUCHES = {
    "job": ("delivery-drain",),  # a tick enqueues, a drain settles, any run may crash
    "usage": ("metering-flush", "ledger-redrive"),
    "foreign": ("ledger-redrive",),
    "rules": ("rss-refresh",),
    "erase": ("erasure-purge",),
    "cancel": ("erasure-purge",),
    "confirm": ("erasure-purge",),
    "operator": ("delivery-drain",),
    "rogue": ("delivery-drain",),
    "iso": ("delivery-drain",),  # an app's enqueue, an operator's action (isolation.py)
    "ledger-redrive": ("metering-flush",),
    "consume": ("delivery-drain", "rss-refresh"),  # a consumer's build fetches and enqueues
    # a store or Redis outage begins: the gated jobs with work that can meet it fire on
    # their grid while it lasts (history-sample only samples: its rate stays, or the
    # samples table would grow with the outages, not with the load)
    "outage": ("delivery-drain", "rss-refresh", "metering-flush", "ledger-redrive",
               "erasure-purge"),
}
TRAIL = 25  # steps printed before a failure
# a lease not released lapses this long after the job's timeout (docs/cron-contract.md)
LEASE_GRACE = timedelta(seconds=10)


def _moment(value: Any) -> datetime:
    """A time read back from the store (SQLite hands some back as text)."""
    return datetime.fromisoformat(value) if isinstance(value, str) else value


@dataclass
class Outcome:
    seed: int
    days: int
    steps: int = 0
    runs: int = 0
    coalesced: dict[str, int] = field(default_factory=dict)  # job -> firings not run
    deliveries: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    trail: list[str] = field(default_factory=list)
    digest: str = ""
    wall_s: float = 0.0
    rows: dict[str, int] = field(default_factory=dict)  # the policy rows reached (rows.py)


class Simulation:
    def __init__(self, seed: int, days: int, directory: Path, clock: SimClock,
                 inject: str | None = None, keep_going: bool = False,
                 limits: bool = False, store: Store = "sqlite") -> None:
        self.seed, self.days, self.directory, self.clock = seed, days, directory, clock
        self.store = store
        self.rng = random.Random(seed)
        self.keep_going = keep_going
        self.limits = limits
        self.world: World = generate(seed, clock.start, days)
        # the faults and load that reach Sluice's limits, on purpose (limits.py)
        limit_crashes = reach_limits(self.world, seed) if limits else []
        # The world is drawn first; the same generator then decides operator choices and
        # crashes, so one seed fixes everything.
        self.network = Network(clock.now, clock.sleep)
        self.network.feeds = self.world.feeds
        self.network.destinations = self.world.destinations
        self.judge = Judge(clock.start)
        self.network.on_receipt = self._receipt
        self.pacing = Pacing(self.judge)
        self.network.on_request = self._request
        self.published = {story.number: story.published for feed in self.world.feeds.values()
                          for story in feed.stories}
        self.story_of = {story.number: (feed.name, story) for feed in self.world.feeds.values()
                         for story in feed.stories}
        self.network.hook_secret = WEBHOOK_SECRET.encode()  # a plain secret: its UTF-8 bytes
        self.charges = Charges(match_of)  # which entry each delivery crash hit
        self.streaks = Streaks()  # whose each answered failure is: the entry's or its receiver's
        self.rows = Rows()
        self.drain_crashes: list[datetime] = []  # when a crash ended a drain run
        self.network.poison = self.world.poison
        self.network.rejected = self.world.rejected
        self.network.oom = set(self.world.oom)
        self.isolation = Isolation(self, self.world.isolation) if self.world.isolation else None
        self.missed = MissedRuns(self)
        # the operator's pauses of a destination (its key), each (start, end)
        self.pauses: dict[str, list[Window]] = {}
        self.charged_reported: set[Match] = set()
        # A match the operator redrove once its destination was enabled (after a justified
        # disable failed it) is owed again from the redrive, by a check of its own: the
        # redrive count that check belongs to. A check scheduled before (by the story's
        # publication) is superseded then: the operator's visit, not Sluice, set when the
        # match could go (seed 85 x 365: redriven three hours after the story, sixth in a
        # Telegram group's backlog, received three minutes past its first deadline).
        self.owed_again: dict[Match, int] = {}
        self.entries_seen: tuple[Any, ...] | None = None  # _entries_changed's last reading
        self.network.polar = self.world.polar
        self.outages = Outages(self.world.outages, clock.now, self.world.armed,
                               self.world.hung)
        self.out = Outcome(seed, days, faults=dict(self.world.faults))
        self.trail: deque[str] = deque(maxlen=TRAIL)
        passed = "".join(f":{k}={v}" for k, v in passed_settings().items())
        self.digest = hashlib.sha256(
            f"{seed}:{days}{passed}{':limits' if limits else ''}"
            f"{':postgres' if store == 'postgres' else ''}".encode())
        if store == "postgres":
            self.out.faults["postgres"] = 1
        self.queue: list[tuple[datetime, int, str, Any]] = []
        self.sequence = 0
        self.firings: dict[str, Firing] = {}
        self.rules_edited = False  # since the last tick
        self.feed_of_url: dict[str, Any] = {}
        self.day30: dict[str, int] | None = None
        # the crash plan draws from a stream of its own: a crash point added to the product
        # changes which points are drawn, never the operator's choices after it
        self.crashes = Crashes(random.Random(f"crashes-{seed}"), self.world.start,
                               self.world.start + timedelta(days=max(days, HORIZON_DAYS)),
                               self.out.faults)
        self.crashes.on_crash = self._crashed
        self.crashes.on_point = self.outages.reached
        self.crashes.passed = self._passed
        self.crashes.now = clock.now
        self.crashes.target_ok = self._last_request_to
        self.crashes.on_duplicate = self._duplicate
        self.running: str | None = None  # the job whose run is alive
        self.invoked: dict[str, list[datetime]] = {}  # job -> when each recorded run began
        self.last_request: Any = None
        self.crashes.plan = sorted(self.crashes.plan + limit_crashes)
        self.rogue = Rogue(inject)
        # odd seeds fan the tick out through the push queue (queues.py); even seeds tick
        # inline, as the regression seeds always have
        self.pipeline = seed % 2 == 1
        self.push: PushQueue | None = None
        self.push_at: datetime | None = None  # the consumer's queued invocation
        self.sent: dict[Match, dict[str, Any]] = {}  # the payload each match went out with
        # the app's notices (--limits): marker number -> the erasure of the user it names
        self.notices = {number: call for _, call, _, number in self.world.notices}

    # --- set-up ---------------------------------------------------------------------

    def _open(self, database_url: str) -> None:
        from sluice.core.services import Services
        from sluice.core.settings import Settings
        from sluice.rss.store import RssStore
        from sluice.store.db import open_database
        from sluice.store.migrate import migrate

        env = settings_env(self.directory, f"sim:{self.seed}:", pipeline=self.pipeline,
                           database_url=database_url)
        migrate(open_database(env["SLUICE_DATABASE_URL"]))
        self.services = Services.from_settings(Settings.from_env(env))
        self.redis = simulated_redis(self.services.settings.redis_key_prefix)
        self.services.__dict__["redis"] = FlakyRedis(self.redis, self.outages)
        self.billing = Billing(self.judge, self.services, self.redis, self._log)
        self.erasures = Erasures(
            self.judge, self.services, self._log,
            reschedule=lambda at, call: self._schedule(at, "erased-due", call),
            windows=self.world.outages.windows, end=self.world.end)
        self.billing.erased = self.erasures.erased
        self.billing.refuses = {call + OUTBOX_SUFFIX for call in self.world.polar_refuses}
        self.network.polar_refuses = self.billing.refuses
        self.network.on_polar_refused = self._polar_refused
        self.erasures.redis = self.redis
        calls: dict[str, list[UsageCall]] = {}
        for call in self.world.usage:
            calls.setdefault(call.user_id, []).append(call)
        self.erasures.written = lambda subject, at: tuple(
            c.entry_id for c in calls.get(subject, ()) if c.at <= at)
        self.erasures.called_at = lambda subject, at: [
            c.at for c in calls.get(subject, ()) if c.at <= at]
        if self.pipeline:
            from sluice.queues.handlers import PIPELINE_FLAG
            from sluice.store.flags import FlagStore

            FlagStore(self.services.state).set(PIPELINE_FLAG, True)
            self.push = PushQueue(self.services, self.clock.now, self.judge, self._log,
                                  self.world.outages.windows, self.world.end,
                                  handler_faults=self.limits)
            self.push.arm(lambda point: self.crashes._crash_point(point))
            self.push.client.throttled = self.world.sqs_throttled
        self.network.on_polar = lambda event: self.billing.polar_received(
            event, self.clock.now())
        self.network.on_polar_request = self.billing.polar_request
        self.expire = timedelta(seconds=self.services.settings.delivery_expire_s)
        rss = RssStore(self.services.db)
        sources = {name: rss.add_source(f"http://{FEEDS}/{name}.xml", name).id
                   for name in sorted(self.world.feeds)}
        # the feeds a tick fetches: those of the scopes (a source no scope uses is not)
        self.feed_of_url = {f"http://{FEEDS}/{name}.xml": self.world.feeds[name]
                            for name in sorted({f for t in self.world.tenants for f in t.feeds})}
        for tenant in self.world.tenants:
            rss.put_scope(tenant.scope, f"org-{tenant.scope}",
                          tuple(sources[f] for f in tenant.feeds), "en", True)
            self._put_rules(tenant.scope)

    def _put_rules(self, scope: str) -> None:
        from sluice.alerts.rules import RulesStore

        now = self.clock.now()
        tenant = next(t for t in self.world.tenants if t.scope == scope)
        body = []
        for rule in tenant.rules:
            keyword = rule.keyword_at(now)
            if keyword is None:
                continue
            recipient = hook_url(rule.recipient) if rule.channel == "webhook" else rule.recipient
            body.append({"id": rule.rule_id, "match": {"keywords": [keyword]},
                         "destination": {"channel": rule.channel, "recipient": recipient}})
        RulesStore(self.services).put(scope, body)

    def _schedule(self, at: datetime, kind: str, what: Any) -> None:
        self.sequence += 1
        heapq.heappush(self.queue, (at, self.sequence, kind, what))

    def _plan(self) -> None:
        from sluice.jobs.registry import JOBS
        from sluice.jobs.schedule import job_schedules, parse

        start = self.world.start
        for job, expressions in sorted(job_schedules(JOBS).items()):
            for n, expression in enumerate(expressions):
                firing = Firing(job, parse(expression), start)
                self.firings[job if n == 0 else f"{job}#{n}"] = firing
                self._fire_at(firing, firing.after(start))
        for tenant in self.world.tenants:
            for rule in tenant.rules:
                for version in rule.versions[1:]:
                    self._schedule(version.since, "rules", tenant.scope)
                self._owe(rule)
        for moment in self.world.operator_at:
            self._schedule(moment, "operator", None)
        for name, peer in sorted(self.world.destinations.items()):
            for window in peer.windows:
                if window.kind == "paused" and window.start < self.world.end:
                    self._schedule(window.start, "pause", (name, window))
        for window in self.world.outages.windows:
            if window.start < self.world.end:
                self._schedule(window.start, "outage", window)
        for call in self.world.usage:
            if call.at < self.world.end:
                self._schedule(call.at, "usage", call)
        for foreign in self.world.foreign:
            if foreign[0] < self.world.end:
                self._schedule(foreign[0], "foreign", foreign)
        for notice in self.world.notices:
            if notice[0] < self.world.end:
                self._schedule(notice[0], "notice", notice)
        for (number, destination), by in sorted(self.world.received_by.items()):
            if by < self.world.end:
                self._schedule(by, "received-by", (number, destination))
        for erasure in self.world.erasures:
            if erasure.at >= self.world.end:
                continue
            self._schedule(erasure.at, "erase", erasure)
            if erasure.cancel_at is not None and erasure.cancel_at < self.world.end:
                self._schedule(erasure.cancel_at, "cancel", erasure)
            if erasure.confirm_at is not None and erasure.confirm_at < self.world.end:
                self._schedule(erasure.confirm_at, "confirm", erasure)
            due = self.erasures.due(erasure, self.world.outages.windows, self.world.end)
            if due is not None:
                self._schedule(due, "erased-due", erasure)
        for moment, point in self.crashes.plan:
            if moment < self.world.end:
                self._schedule(moment, "crash", point)
        if self.isolation is not None:
            self.isolation.schedule()
        self.missed.schedule()
        self._schedule(start + timedelta(days=30), "measure", None)
        if self.days >= 90:
            self._schedule(self.world.end - timedelta(minutes=1), "bounded", None)

    def _fire_at(self, firing: Firing, at: datetime) -> None:
        if firing.queued == at:
            return
        firing.token += 1
        firing.queued = at
        self._schedule(at, "job", (firing, firing.token))

    def _replan(self, kind: str, what: Any) -> None:
        """The next firing of each gated job a step may have given work: the first that can
        do something, at the latest one ``IDLE_EVERY`` after its last run (see
        ``firing.py``)."""
        now = self.clock.now()
        touched = set(TOUCHES.get(kind, ()))
        if kind == "usage" and not self.billing.queued:
            touched.discard("ledger-redrive")  # only a call queued in Redis gives it work
        if kind == "job":
            touched |= {what[0].job, *TOUCHES.get(what[0].job, ())}
        for firing in self.firings.values():
            if not firing.gated or firing.job not in touched:
                continue
            wake: datetime | None = None
            outage = (self.world.outages.behaviour(now) != "up"
                      and firing.job in TOUCHES["outage"])
            if firing.again or outage:
                # while a store is down a deployment's jobs keep firing into the outage:
                # what they do then is what the outage is injected for
                wake = now
            elif firing.job == "delivery-drain":
                wake = drain_wake(self.services.db, self.expire)
            elif firing.job == "rss-refresh":
                wake = now if self.rules_edited else tick_wake(
                    self.services.db, self.feed_of_url, self.world.start)
            elif firing.job == "metering-flush":
                wake = now if outbox_waiting(self.services.db) else None
            elif firing.job == "ledger-redrive":
                wake = now if retry_waiting(self.redis) else None
            elif firing.job == "erasure-purge":
                wake = erasure_wake(self.services.db)
            at = firing.after(firing.last + IDLE_EVERY - timedelta(microseconds=1))
            if wake is not None:
                at = min(at, firing.ceil(max(wake, now, firing.last + timedelta(microseconds=1))))
            self._fire_at(firing, at)

    # --- the loop -------------------------------------------------------------------

    def run(self) -> Outcome:
        started = time.perf_counter()
        with seeded_ids(self.seed), \
                database(self.store, self.directory, self.seed) as url:  # the ids: their order
            self._run(url)                                              # shapes the history
        self.out.wall_s = time.perf_counter() - started
        return self.out

    def _run(self, database_url: str) -> None:
        self._open(database_url)
        self._plan()
        from sluice.jobs.registry import JOBS

        for job in JOBS.values():  # imported before the crash points are replaced
            job.resolve()
        with Installed(self.network), SimulatedWaits(), self.crashes.installed(), \
                inline_pools(), self.outages.installed(), self.charges.installed(), \
                self.rows.installed():
            while self.queue and (self.keep_going or not self.judge.violations):
                at, _, kind, what = heapq.heappop(self.queue)
                if kind == "job" and what[1] != what[0].token:
                    continue  # a firing planned again since
                if at > self.world.end:
                    break
                self.clock.move_to(at)
                self._step(kind, what)
                with self.outages.harness():
                    self._replan(kind, what)
                    self._replan_queue()
                if self.judge.violations and not self.out.trail:
                    self.out.trail = list(self.trail)  # the steps up to the first one
        with self.outages.harness():
            self.erasures.check(self.world.end, final=True)
        if self.push is not None:
            with self.outages.harness():
                self.push.check(owed_at)
            self.out.faults["queue_batches"] = self.push.batches
            if self.push.own_failures:
                self.out.faults["handler_fault"] = sum(self.push.own_failures.values())
        self.out.deliveries = len(self.network.receipts)
        self.out.coalesced = {name: firing.grid_count(self.world.end) - firing.fired
                              for name, firing in sorted(self.firings.items())
                              if firing.gated}
        self.out.violations = list(self.judge.violations)
        self.out.rows = dict(self.rows.reached)
        self.out.trail = self.out.trail or list(self.trail)
        self.out.digest = self.digest.hexdigest()[:16]
        self.services.close()

    def _log(self, line: str) -> None:
        stamp = f"day {self.clock.day():7.3f} {self.clock.now():%Y-%m-%d %H:%M:%S}"
        self.trail.append(f"{stamp}  {line}")
        self.digest.update(f"{stamp}|{line}\n".encode())
        self.out.steps += 1

    def _replan_queue(self) -> None:
        """The consumer's next invocation: when the first message becomes visible."""
        if self.push is None:
            return
        at = self.push.next_visible()
        if at is not None and at != self.push_at:
            self.push_at = at
            self._schedule(max(at, self.clock.now()), "consume", at)

    def _step(self, kind: str, what: Any) -> None:
        before, dialled = len(self.network.receipts), len(self.network.refused_hosts)
        unsigned = len(self.network.unsigned)
        if kind == "consume":
            if self.push is None or what != self.push_at:
                return  # planned again since
            self.push_at = None
            line = self.push.consume(SimCrash)
            if line:
                self._log(line)
            with self.outages.harness():
                self.push.check(owed_at)
        elif kind == "job":
            firing = what[0]
            if not firing.gated:
                self._fire_at(firing, firing.after(self.clock.now()))
            if self.missed.skipped(firing.job, self.clock.now()):
                self._log(f"{firing.job}: not invoked by the platform (a missed run)")
                return
            self._job(firing)
        elif kind == "usage":
            self._usage(what)
        else:
            with self.outages.harness():
                self._event(kind, what)
        for hook in self.network.unsigned[unsigned:]:
            self.judge.fail("webhook_signed", self.clock.now(),
                            f"a webhook to {hook} fails the receiver's Standard Webhooks check "
                            "(signature, timestamp, or an id other than its idempotency key)")
        for host in self.network.refused_hosts[dialled:]:
            self.judge.fail("sealed", self.clock.now(),
                            f"the deployment tried to reach {host}, which is no stand-in: a "
                            "client the simulator does not replace")
        with self.outages.harness():
            for receipt in self.network.receipts[before:]:
                self._rogue_after_receipt(receipt)
                self._log(f"  received story-{receipt.story} at {receipt.channel}:"
                          f"{receipt.recipient}{' (answered late)' if receipt.late else ''}")

    def _event(self, kind: str, what: Any) -> None:
        if kind == "rules":
            self.rules_edited = True
            self._put_rules(what)
            self._log(f"rules of {what} changed")
        elif kind == "operator":
            self._operator()
        elif kind == "pause":
            self._pause(*what)
        elif kind == "outage":
            self._log(f"{what.kind} until {what.end:%Y-%m-%d %H:%M:%S}")
        elif kind == "crash":
            self.crashes.arm(what)
            self._log(f"crash armed at {what}")
        elif kind == "owed":
            match, published, delayed, redrives = what
            # superseded when a redrive since owes it again, on a check of its own
            if self.owed_again.get(match, -1) <= redrives:
                self.judge.owed(match, self.clock.now(), published, delayed,
                                resting=self._resting(match))
        elif kind == "rogue":
            self.rogue.enqueue_copy(self.services, what)
            self._log(f"rogue producer enqueued {match_of_like(what)} again")
        elif kind == "measure":
            self.day30 = self._sizes()
            self._log(f"sizes at day 30: {self.day30}")
        elif kind == "bounded" and self.day30 is not None:
            self.judge.bounded(self.clock.now(), self.day30, self._sizes(), kept_days={
                "job_runs": self.services.settings.job_runs_retention_days})
        elif kind == "metered":
            self.billing.owed(what, self.network.polar_ids, self.clock.now())
        elif kind == "foreign":
            self.billing.foreign(*what)
        elif kind == "erase":
            self.erasures.request(what)
        elif kind == "cancel":
            self.erasures.cancel(what)
        elif kind == "confirm":
            self.erasures.confirm(what, self.clock.now())
        elif kind == "refused":
            self.billing.refusal_shown(what, self.clock.now())
        elif kind == "erased-due":
            self.erasures.check_purged(what, self.clock.now())
        elif kind == "received-by":
            self._built_in_its_tick(*what)
        elif kind == "notice":
            self._notice(*what)
        elif kind == "iso" and self.isolation is not None:
            self.isolation.step(what)
        elif kind == "missed-check":
            self.missed.check()

    def _notice_erased(self, receipt: Receipt) -> None:
        """``nothing_comes_back`` for the app's notices (``--limits``): a notice naming a
        user never reaches its receiver once the user's erasure was owed (its grace window
        over, the purge's hour run: ``Erasures.due``), judged from the receiver's record."""
        call = self.notices[receipt.story]
        user = call.subject
        due = self.erasures.due(call, self.world.outages.windows, self.world.end)
        if due is not None and receipt.at >= due:
            self.judge.fail("nothing_comes_back", receipt.at,
                            f"the app's notice story-{receipt.story} naming {user} reached "
                            f"{receipt.channel}:{receipt.recipient} after {user}'s erasure "
                            f"was due ({due:%Y-%m-%d %H:%M})")

    def _notice(self, at: datetime, call: ErasureCall, destination: str, number: int) -> None:
        """The app's own notification to ``user`` (``--limits``), enqueued as an app does
        (``sluice.enqueue_delivery``), naming them as its subject and in its text."""
        from sluice import enqueue_delivery

        user = call.subject
        channel, recipient = destination.split(":", 1)
        text = f"Your export is ready, {user} (story-{number})"
        try:
            enqueue_delivery(self.services, channel, recipient,
                             {"payloads": [text], "silent": False},
                             idempotency_key=f"notice-{number}", subject_user_id=user)
        except Exception as exc:  # noqa: BLE001 - the store away: the app would retry; not here
            self._log(f"app notice story-{number} to {destination} not enqueued "
                      f"({type(exc).__name__})")
            return
        self._log(f"app notice story-{number} to {destination} for {user}")

    def _built_in_its_tick(self, number: int, destination: str) -> None:
        """``built_in_its_tick``: a lone story of an SQS window (``--limits``), its feed,
        its destination and the stores clear, has reached that destination by the tick
        after it (and the drain's next minutes): a per-build message the endpoint left
        unanswered is built inline in its tick, not a tick later. Judged from the
        destination's own record."""
        channel, recipient = destination.split(":", 1)
        if self.judge.received[(channel, recipient, number)]:
            return
        unanswered = len(self.push.client.unanswered) if self.push is not None else 0
        self.judge.fail("built_in_its_tick", self.clock.now(),
                        f"story-{number} (published {self.published[number]:%Y-%m-%d %H:%M}"
                        f", while SQS answered one send a minute: {unanswered} send(s) "
                        f"unanswered so far) has not reached {destination} by the tick "
                        "after it")

    def _usage(self, call: UsageCall) -> None:
        """A model call reported; refused (both stores down), it is reported again later."""
        if not self.billing.report(call):
            self.out.faults["usage_retry"] = self.out.faults.get("usage_retry", 0) + 1
            self._schedule(self.clock.now() + USAGE_RETRY, "usage", call)
            return
        with self.outages.harness():
            if self.rogue.meter_again(self.services, call.entry_id):
                self._log(f"rogue biller metered {call.entry_id} again")
            if call.user_id in self.erasures.ids:
                self.erasures.check(self.clock.now())
        if call.entry_id + OUTBOX_SUFFIX not in self.billing.accepted:
            return  # an erased user's call, dropped
        due = owed_at(self.clock.now(), [*self.world.polar.windows,
                                         *self.world.outages.windows], self.world.end)
        if due is not None:
            self._schedule(due, "metered", call.entry_id + OUTBOX_SUFFIX)

    def _polar_refused(self, external_id: str) -> None:
        """Polar refused ``external_id`` for good: where it shows is judged an hour on, with
        Polar and the stores up (``refused_for_good``)."""
        now = self.clock.now()
        if self.billing.polar_refused(external_id, now):
            due = owed_at(now, [*self.world.polar.windows, *self.world.outages.windows],
                          self.world.end)
            if due is not None:
                self._schedule(due, "refused", external_id)

    def _receipt(self, receipt: Receipt) -> None:
        """A message the store could not settle after its send (it was down) is an unknown
        outcome, like a crash after the send: its documented re-send is allowed."""
        if receipt.story in self.notices:
            self._notice_erased(receipt)
        self._content(receipt)
        self._expiry(receipt)
        if self.world.outages.behaviour(receipt.at) == "store_down":
            match = (receipt.channel, receipt.recipient, receipt.story)
            self.judge.late.add(match)
            self.judge.unknown_sends[match] += 1
        self.judge.receipt(receipt)

    def _expiry(self, receipt: Receipt) -> None:
        """``expiry_kept``: an entry not delivered within the expiry (a day, from when it was
        enqueued) fails for good; a story whose enqueue the world can bound (a lone story
        of ``--limits``) is never received by its destination later than that, unless an
        operator redrove it."""
        match = (receipt.channel, receipt.recipient, receipt.story)
        enqueued_by = self.world.enqueued_by.get(
            (receipt.story, f"{receipt.channel}:{receipt.recipient}"))
        if enqueued_by is None or self.judge.redrives[match]:
            return
        if receipt.at > enqueued_by + self.expire:
            self.judge.fail("expiry_kept", receipt.at,
                            f"story-{receipt.story} reached {receipt.channel}:"
                            f"{receipt.recipient} {receipt.at - enqueued_by} after it was "
                            f"enqueued (by {enqueued_by:%Y-%m-%d %H:%M}); entries expire "
                            f"after {self.expire}")

    def _content(self, receipt: Receipt) -> None:
        """``content_intact``: the receiver got the story its feed published: its number,
        its link and every word of it (each channel formats them its own way)."""
        found = self.story_of.get(receipt.story)
        if found is None:
            return
        feed, story = found
        wanted = [f"story-{story.number}", f"http://{FEEDS}/{feed}/story-{story.number}",
                  *story.words]
        missing = [part for part in wanted if part not in receipt.text]
        if missing:
            self.judge.fail("content_intact", receipt.at,
                            f"story-{story.number} reached {receipt.channel}:"
                            f"{receipt.recipient} without {', '.join(missing)}: "
                            f"{receipt.text[:120]!r}")

    def _job(self, firing: Firing) -> None:
        from sluice.jobs.registry import get_job
        from sluice.jobs.runner import run_job

        name = firing.job
        now = self.clock.now()
        job = get_job(name)
        firing.last = now
        firing.fired += 1
        if name == "rss-refresh":
            self.rules_edited = False
        deadline_ms = job.timeout_s * 1000

        def remaining_ms() -> int:
            return int(deadline_ms - (self.clock.now() - now).total_seconds() * 1000)

        if name == "metering-flush":
            self.billing.flush_started()
        worked = True  # the run may have written something
        self.running = name
        stopped = False  # the run ended before its end (a crash, an error)
        if name == "delivery-drain":
            self.charges.begin()
        try:
            outcome = run_job(job, self.services, "schedule", lambda_remaining_ms=remaining_ms)
            stopped = outcome.outcome == "error"
            if outcome.outcome == "skipped":
                self._skip_honest(name, now, job.timeout_s)
            if outcome.outcome in ("ok", "failures", "skipped"):  # a run it recorded
                self.invoked.setdefault(name, []).append(now)
            summary = f"{name}: {outcome.outcome} {brief(outcome.body)}"
            firing.again = outcome.outcome not in ("ok", "skipped")
            worked = any(outcome.body.get(key, 1 if outcome.outcome != "ok" else 0)
                         for key in ("drained", "due", "purged", "failed", "resumed"))
        except SimCrash as crash:
            summary = f"{name}: crashed at {crash.point}"
            firing.again = True
            stopped = True
            self.invoked.setdefault(name, []).append(now)  # begun: its run is recorded
        finally:
            self.running = None
        if name == "delivery-drain" and stopped:
            with self.outages.harness():
                self.charges.stopped(self._entry)
        if name in ("erasure-purge", "ledger-redrive") and worked:
            self.erasures.touch()
        if name == "ledger-redrive" and summary.startswith(f"{name}: ok"):
            self.erasures.redrive_ok = self.clock.now()
        if name == "metering-flush":
            self.billing.flush_ended(self.clock.now())
        self.out.runs += 1
        took = (self.clock.now() - now).total_seconds()
        self.judge.run_ended(name, self.clock.now(), took, job.timeout_s)
        self._log(summary)
        with self.outages.harness():
            if name == "delivery-drain" and self._entries_changed():
                self._observe_failed()
                self._check_attempts()
            elif name in ("metering-flush", "ledger-redrive"):
                self.billing.check_attempts(self.clock.now())
            if name in ("erasure-purge", "ledger-redrive"):
                self.erasures.check(self.clock.now())
            if name == "state-cleanup":
                self._history_kept()

    def _history_kept(self) -> None:
        """``history_kept``: after each state-cleanup, every run the platform invoked (and
        Sluice began: its outcome ok, failures, skipped or a crash) within the documented
        retention (``SLUICE_JOB_RUNS_RETENTION_DAYS``, less an hour) is in its job's run
        history as the console reads it (``RunStore.recent``)."""
        from sluice.jobs.runs import RunStore

        now = self.clock.now()
        cutoff = now - timedelta(days=self.services.settings.job_runs_retention_days,
                                 hours=-1)
        runs = RunStore(self.services.db)
        for name, started in sorted(self.invoked.items()):
            self.invoked[name] = kept = [at for at in started if at >= cutoff]
            if not kept:
                continue
            listed = sum(1 for row in runs.recent(name, limit=len(kept) + 100)
                         if _moment(row["started_at"]) >= cutoff)
            if listed < len(kept):
                self.judge.fail("history_kept", now,
                                f"{name}: {listed} runs in its history since "
                                f"{cutoff:%Y-%m-%d %H:%M}, of the {len(kept)} invoked then "
                                "(within the runs' retention)")

    def _skip_honest(self, name: str, now: datetime, timeout_s: int) -> None:
        """``single_flight``: a firing is answered ``already_running`` only while another
        run of the job may hold its lease by right. Runs here never overlap (but for a
        duplicate invocation, judged apart), so that is a run that ended while the store
        was down, unable to release its lease, which then lapses at the job's timeout plus
        the grace."""
        ttl = timedelta(seconds=timeout_s) + LEASE_GRACE
        if any(w.kind == "store_down" and w.start < now and now - ttl < w.end
               for w in self.world.outages.windows):
            return
        self.judge.fail("single_flight", now,
                        f"{name} was answered already_running although no run of it was "
                        f"alive and the store was up through the last {ttl}: a lease "
                        "outlived its run")

    def _duplicate(self, point: str) -> None:
        """EventBridge invokes the job's function again while its run is alive (at
        ``point``): ``single_flight`` wants that invocation answered ``already_running``."""
        from sluice.jobs.registry import get_job
        from sluice.jobs.runner import run_job

        name = self.running
        if name is None:
            return
        try:
            outcome = run_job(get_job(name), self.services, "schedule")
        except SimCrash:
            return
        self._log(f"{name}: a duplicate invocation at {point}: {outcome.outcome}")
        if outcome.outcome != "skipped":
            self.judge.fail("single_flight", self.clock.now(),
                            f"a second invocation of {name} while its run was alive (at "
                            f"{point}) was not answered already_running but ran "
                            f"({outcome.outcome}): two runs of one job at once")

    def _rogue_after_receipt(self, receipt: Any) -> None:
        if self.rogue.name not in ("resend-after-retention", "repeat-late"):
            return
        from sluice.delivery.store import DeliveryStore

        match = (receipt.channel, receipt.recipient, receipt.story)
        if match in self.sent:
            return
        entries = [e for e in DeliveryStore(self.services.db).list(limit=500)
                   if match_of(e) == match]
        if not entries:
            return
        self.sent[match] = copy = like(entries[0])
        if self.rogue.name == "resend-after-retention":
            self._schedule(receipt.at + RETENTION_LIKE, "rogue", copy)
        elif receipt.late:
            self._schedule(receipt.at + timedelta(minutes=1), "rogue", copy)
            self._schedule(receipt.at + timedelta(minutes=2), "rogue", copy)

    def _crashed(self, point: str) -> None:
        """A crash right after a send: the message arrived, the entry still says in flight.
        Its next send is the documented re-send of an unknown outcome."""
        if point.startswith("delivery."):
            self.drain_crashes.append(self.clock.now())
        last = self.last_request
        self.charges.hit(point, (last.channel, last.recipient, last.story)
                         if last is not None else None)
        if point.startswith("metering."):
            self.billing.crashes += 1
        if point in SENT_POINTS:
            self.streaks.undo()
        if point == "delivery.after_send" and self.network.receipts:
            last = self.network.receipts[-1]
            self.judge.late.add((last.channel, last.recipient, last.story))
            self.judge.unknown_sends[(last.channel, last.recipient, last.story)] += 1
        for match in self.charges.in_round:  # sent (or not yet) in the crashed round
            self.judge.late.add(match)
            if self.judge.received[match]:
                self.judge.unknown_sends[match] += 1

    def _passed(self, point: str) -> None:
        """A crash point the code goes on from: right after a drain's claim whose run goes
        on to send, an operator action waiting for that claim (``isolation.py``)."""
        if point == "delivery.after_claim" and self.isolation is not None:
            self.isolation.on_claim(self.charges.claimed)

    def _request(self, request: Any) -> None:
        self.last_request = request
        self.pacing.request(request)
        self.streaks.request(request)
        key = destination_of(request.channel, request.recipient)
        if any(w.start <= request.at < w.end for w in self.pauses.get(key, ())):
            self.judge.fail("pause_kept", request.at,
                            f"story-{request.story} -> {request.channel}:{request.recipient} "
                            f"sent while the operator paused {key}")
        if self.isolation is not None:
            self.isolation.on_request(request)

    def _pause(self, name: str, window: Window) -> None:
        """The operator pauses the destination until the window's end (``pause_kept``)."""
        from sluice.core.times import iso_z
        from sluice.ops.destinations import apply, describe, parse_change

        channel, recipient = name.split(":", 1)
        key = destination_of(channel, recipient)
        now = self.clock.now()
        if describe(self.services, key)["disabled"] is not None:  # a pause needs it enabled
            enabled = apply(self.services, parse_change("enable", key, {}))
            self._log(f"operator enabled {key} to pause it")
            honoured(self.judge, now, "enable", key, enabled["current"]["state"] != "disabled")
            if enabled["current"]["state"] == "disabled":
                return
        paused = apply(self.services, parse_change("pause", key, {"until": iso_z(window.end)}))
        honoured(self.judge, now, "pause", key, paused["current"]["state"] == "paused")
        self.pauses.setdefault(key, []).append(window)
        self._log(f"operator paused {key} until {window.end:%Y-%m-%d %H:%M}")

    def _last_request_to(self, destination: str) -> bool:
        """Whether the entry the drain holds now (its claim, or its request that just
        left) is one to ``destination``: a crash targeted at it falls on that entry."""
        claimed = self.charges.claimed[:1]
        if claimed:
            channel, recipient, _ = match_of(claimed[0])
            return f"{channel}:{recipient}" == destination
        last = self.last_request
        return last is not None and f"{last.channel}:{last.recipient}" == destination

    def _owe(self, rule: SimRule) -> None:
        for due, match, published, delayed in owed_matches(self.world, rule):
            self._schedule(due, "owed", (match, published, delayed,
                                         self.judge.redrives[match]))

    def _entry(self, entry_id: str) -> Any:
        """The delivery entry as the store has it now (None: gone)."""
        from sluice.core.errors import NotFound
        from sluice.delivery.store import DeliveryStore

        try:
            return DeliveryStore(self.services.db).get(entry_id)
        except NotFound:
            return None

    def _charged(self, match: Match) -> bool:
        """Whether something outside the entry's destination charged its attempts: a
        timeout after the message arrived, or a crash that hit this entry (``charges.py``;
        a crash elsewhere explains nothing about it)."""
        return match in self.judge.late or self.charges.hits[match] > 0

    def _resting(self, match: Match) -> bool:
        """Whether the documented policy may leave the match unsent as an unknown outcome,
        from what its destination saw (``may_rest_unknown``), not from the entry's status:
        a defect that leaves an entry resting too early is then a loss."""
        return may_rest_unknown(match[0], self.judge.unknown_sends[match],
                                self.pacing.asked[match])

    def _entries_changed(self) -> bool:
        """Whether the delivery entries may list differently since the checks last read
        them. Both checks only judge what the listing shows against the world's records,
        which only grow (a request seen, a crash, a refusal, the clock), so an unchanged
        listing cannot fail anew: reading it after every drain cost a seed an eighth of
        its time. The reading is a cache key, never a verdict, and covers what the checks
        read (how many entries, their attempts, their statuses, the last write)."""
        with self.services.db.transaction() as tx:
            row = tx.fetchone(
                "SELECT count(*) AS n, total(attempts) AS a, total(attempts * attempts) AS a2,"
                " total(status = 'failed') AS f, max(updated_at) AS u, max(rowid) AS r"
                " FROM delivery_queue" if tx.dialect == "sqlite" else
                "SELECT count(*) AS n, sum(attempts) AS a, sum(attempts * attempts) AS a2,"
                " sum(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS f,"
                " max(updated_at) AS u FROM delivery_queue", {})
        seen = tuple(row.values()) if row else None
        if seen == self.entries_seen:
            return False
        self.entries_seen = seen
        return True

    def _observe_failed(self) -> None:
        observe_failed(self.services, self.judge, self.clock.now(), self._justified)

    def _check_attempts(self) -> None:
        """``no_attempt_burned`` for deliveries: no entry (as the API lists it) shows more
        attempts than its destination saw requests for its match, plus one while the claim
        of a run that stopped before sending it still holds it (``charges.py``: the lapse
        gives that attempt back; a stop explains nothing about an entry it did not hold),
        less its answered failures that were its receiver's (``streaks.py``: another entry
        failed there too before any success; the first one's attempt is given back). A wait
        on a down destination or a rate limit gives its attempt back."""
        from sluice.delivery.store import DeliveryStore

        for entry in DeliveryStore(self.services.db).list(limit=500):
            match = match_of(entry)
            crashes = self.charges.forgiven(entry)
            seen = self.pacing.asked[match]
            receivers = self.streaks.uncounted(match)
            if (entry.attempts > seen - receivers + crashes
                    and match not in self.charged_reported):
                self.charged_reported.add(match)
                self.judge.fail("no_attempt_burned", self.clock.now(),
                                f"story-{match[2]} -> {match[0]}:{match[1]} shows "
                                f"{entry.attempts} attempts; its destination saw {seen} "
                                f"requests for it, {receivers} of them failures that were "
                                f"its receiver's (another entry failed there too before any "
                                f"success), and {crashes} crash(es) could have charged it")

    def _justified(self, match: Match, entry: Any = None) -> str | None:
        """Why an entry may have failed for good, from what the world and the peers know
        (None: nothing did, so an outage or a defect burned it: ``no_attempt_burned``).
        A destination refused it; its destination was disabled for a cause the world
        gave (a refusal to it: the operator enables it and redrives, and the match is owed
        again); it outlived the expiry (a day) from its story's publication, not counting
        a pause (the pause's end restarts it); a timeout or a crash charged its attempts."""
        published = self.published.get(match[2])
        if (match in self.network.refusals or match in self.network.poison
                or match in self.network.rejected):
            return "refused"  # by its receiver: permanently, or a 500 to it alone
        key = destination_of(match[0], match[1])
        if entry is not None and entry.failure_reason == "destination_disabled":
            by_operator = self.isolation is not None and self.isolation.justified(
                key, entry.failed_at)
            return "disabled" if by_operator or any(
                self._disabled_for_cause(k) for k in {entry.destination, entry.receiver} if k
            ) else None
        if published is None or self.clock.now() >= self._expires(key, published):
            return "expired"
        if self._charged(match):
            return "charged"
        return None

    def _expires(self, key: str, published: datetime) -> datetime:
        """When a match published then may expire at the earliest: the expiry from its
        publication, or from the end of each pause of its destination it waited through."""
        at = published + self.expire
        for window in sorted(self.pauses.get(key, ())):
            if at > window.start:
                at = max(at, window.end + self.expire)
        return at

    def _disabled_for_cause(self, key: str) -> bool:
        """Sluice shows ``key`` disabled, and the world gave it a cause: a refusal to it
        (``gone:``). The simulated operator never disables, and no destination here fails
        for ``SLUICE_DESTINATION_DISABLE_AFTER``: any other disable is a defect."""
        from sluice.ops.destinations import describe

        found = describe(self.services, key)["disabled"]
        if found is not None and found["reason"].startswith("failing without a success"):
            after = timedelta(seconds=self.services.settings.destination_disable_after_s)
            return any(w.kind == "down" and w.end - w.start >= after
                       for name, peer in self.world.destinations.items()
                       if destination_of(*name.split(":", 1)) == key for w in peer.windows)
        return (found is not None and found["reason"].startswith("gone:")
                and any(key in keys_of(channel, recipient)
                        for channel, recipient, _ in self.network.refusals))

    def _answers(self, key: str) -> bool:
        """Every peer behind ``key`` answers now."""
        now = self.clock.now()
        peers = [peer for name, peer in self.world.destinations.items()
                 if key in keys_of(*name.split(":", 1))]
        return bool(peers) and all(peer.behaviour(now) in ("up", "paused") for peer in peers)

    def _operator(self) -> None:
        owed = visit(self.services, self.rng, self.judge, self.rogue, self.clock.now(),
                     self._log, self.out.faults, self._answers,
                     lambda match: match in self.network.refusals)
        for match in owed:  # redriven once its destination was enabled: owed again
            channel = match[0]
            windows = [w for name, peer in sorted(self.world.destinations.items())
                       if name.startswith(f"{channel}:") for w in peer.windows]
            stores = [Window(w.start, w.end + STORE_SETTLE, w.kind)
                      for w in self.world.outages.windows]
            due = owed_at(self.clock.now(), [*windows, *stores], self.world.end,
                          LIVENESS_AFTER)
            published = self.published.get(match[2])
            if due is not None and published is not None:
                self.owed_again[match] = self.judge.redrives[match]
                self._schedule(due, "owed", (match, published, True,
                                             self.judge.redrives[match]))

    def _sizes(self) -> dict[str, int]:
        """Each bounded table's rows; ``job_runs`` without the runs started during a store or
        Redis outage (the jobs fire on their grid then: a burst of the outage's, not the
        steady load the bound is about)."""
        sizes: dict[str, int] = {}
        windows = self.world.outages.windows
        with self.services.db.transaction() as tx:
            for table in BOUNDED_TABLES:
                if table == "job_runs":
                    sizes[table] = sum(
                        1 for row in tx.fetchall("SELECT started_at FROM job_runs", {})
                        if not any(w.start <= row["started_at"] < w.end for w in windows))
                    continue
                row = tx.fetchone(f"SELECT COUNT(*) AS n FROM {table}", {})
                sizes[table] = int(row["n"]) if row else 0
        return sizes
