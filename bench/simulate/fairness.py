"""The isolation world at run time (``isolation.py`` draws it): the app's enqueues, the
operator's actions in the middle of drain runs (from the receivers' request handler), and
the checks judged from the receivers' own records: ``fair_share``, ``resumed``,
``chunks_whole``, ``request_path_kept`` (see ``isolation.py`` for what each holds)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from bench.simulate.isolation import (
    DISABLED,
    DRAIN_EVERY,
    EMAIL,
    GONE_URL,
    GROUP,
    LAPSED,
    LEASE,
    LONG_PACED,
    PAUSE_FOR,
    POISONED_LATE,
    SLACK,
    STALE,
    TRIGGERS,
    UNKNOWN_MARKED,
    UNKNOWN_SENT_AGAIN,
    Message,
    Plan,
    rate_key,
)
from bench.simulate.peers import Window


class Isolation:
    """The isolation world at run time: the app's enqueues, the operator's actions in the
    middle of drain runs, and the ``fair_share``, ``resumed`` and ``chunks_whole`` checks."""

    def __init__(self, sim: Any, found: Plan) -> None:
        self.sim, self.plan = sim, found
        self.by_number = {m.number: m for m in found.messages}
        self.due: dict[int, datetime] = {}
        self.pending = {action: (target, trigger, found.start + after)
                        for action, target, trigger, after, _ in TRIGGERS}
        self.disabled: list[tuple[str, datetime, datetime | None]] = []  # key, from, to
        self.resumed_at: datetime | None = None
        self.group_asked: list[datetime] = []
        self.acting = False

    def schedule(self) -> None:
        start = self.plan.start
        self.sim._schedule(start - timedelta(minutes=2), "iso", ("disable", DISABLED))
        for moment in sorted({m.at for m in self.plan.messages}):
            self.sim._schedule(moment, "iso", ("enqueue", moment))
        for action, target, _, _, fallback in TRIGGERS:
            self.sim._schedule(start + fallback, "iso", (action, target))
        for moment in self.plan.probes:
            self.sim._schedule(moment, "iso", ("probe", None))
        later = start + timedelta(minutes=90)  # the unknown ones rest by then
        self.sim._schedule(later, "iso", ("unknown", None))
        self.sim._schedule(later + timedelta(minutes=10), "iso", ("purge", None))

    # --- steps ---------------------------------------------------------------------

    def step(self, what: tuple[str, Any]) -> None:
        kind, arg = what
        if kind == "enqueue":
            self._enqueue(arg)
        elif kind == "disable":
            self._act("disable", arg)
        elif kind == "check":
            self._fair(arg)
        elif kind == "resumed":
            self._resumed()
        elif kind == "unknown":
            self._unknown()
        elif kind == "probe":
            self._probe()
        elif kind == "purge":
            self._purge()
        elif kind in self.pending:
            del self.pending[kind]
            self._act(kind, arg)

    def on_request(self, request: Any) -> None:
        """The receivers' request handler: an operator action whose trigger this request is
        lands now, between this send and the run's next one."""
        if self.acting:
            return
        to = f"{request.channel}:{request.recipient}"
        if request.answer == "oom":  # the run stops: what it had not sent waits for the next
            self.sim.drain_crashes.append(request.at)
        if to == GROUP:
            self.group_asked.append(request.at)
        for action, (target, trigger, after) in list(self.pending.items()):
            if trigger == to and request.at >= after:
                del self.pending[action]
                self.acting = True
                try:
                    with self.sim.outages.harness():
                        self._act(action, target, mid_run=True)
                finally:
                    self.acting = False

    def _enqueue(self, moment: datetime) -> None:
        from sluice import enqueue_delivery

        sent = 0
        for message in self.plan.messages:
            if message.at != moment:
                continue
            channel, recipient = message.destination.split(":", 1)
            if channel == "webhook":
                from bench.simulate.hosts import hook_host

                recipient = f"http://{hook_host(recipient)}/{recipient}"
            enqueue_delivery(self.sim.services, channel, recipient,
                             {"payloads": [message.text], "silent": False},
                             idempotency_key=message.key)
            self.sim.published[message.number] = moment
            sent += 1
            self._owe(message, moment)
        self.sim._log(f"app enqueued {sent} message(s) (isolation)")

    def _owe(self, message: Message, due: datetime) -> None:
        """Schedule ``fair_share``'s check of ``message``, due at ``due``."""
        if (message.destination in (GROUP, GONE_URL, STALE, EMAIL, LONG_PACED, LAPSED,
                                    UNKNOWN_MARKED)
                or message.number in self.plan.poison or message.number in self.plan.rejected):
            return  # its own destination's state, or its own entry's, decides when it goes
        if message.destination == DISABLED and due == message.at:
            return  # failed by the operator's disable; owed from the redrive
        self.due[message.number] = due
        key, interval = rate_key(message.destination)
        before = sum(1 for m in self.plan.messages if m.number < message.number
                     and self.due.get(m.number) == due and rate_key(m.destination)[0] == key)
        self.sim._schedule(due + DRAIN_EVERY + before * interval + SLACK, "iso",
                           ("check", (message.number, due, 0)))

    def _act(self, action: str, target: str, mid_run: bool = False) -> None:
        from bench.simulate.operator import destination_of
        from sluice.core.times import iso_z
        from sluice.ops.destinations import apply, parse_change

        sim, now = self.sim, self.sim.clock.now()
        key = destination_of(*target.split(":", 1))
        where = " mid-run" if mid_run else ""
        if action == "pause":
            until = now + PAUSE_FOR
            apply(sim.services, parse_change("pause", key, {"until": iso_z(until)}))
            sim.pauses.setdefault(key, []).append(Window(now + timedelta(microseconds=1),
                                                         until, "paused"))
            sim.out.faults["operator_pause"] = sim.out.faults.get("operator_pause", 0) + 1
        elif action == "resume":
            apply(sim.services, parse_change("resume", key, {}))
            sim.pauses[key] = [Window(w.start, min(w.end, now), w.kind)
                               for w in sim.pauses.get(key, ())]
            self.resumed_at = now
            sim._schedule(now + DRAIN_EVERY + SLACK, "iso", ("resumed", None))
        elif action == "disable":
            apply(sim.services, parse_change("disable", key, {"reason": "operator"}))
            self.disabled.append((key, now, None))
        elif action == "enable":
            apply(sim.services, parse_change("enable", key, {}))
            self.disabled = [(k, s, now if k == key and e is None else e)
                             for k, s, e in self.disabled]
            self._restart(target, "redrive", now)
        elif action == "replay":
            self._restart(target, "replay", now)
        sim._log(f"operator {action} {key}{where} (isolation)")

    def _restart(self, target: str, how: str, now: datetime) -> None:
        """Redrive the failed entries of ``target``, or replay its delivered ones, and owe
        each from now."""
        from bench.simulate.operator import match_of
        from sluice.delivery.store import DeliveryStatus, DeliveryStore

        store = DeliveryStore(self.sim.services.db)
        wanted = DeliveryStatus.FAILED if how == "redrive" else DeliveryStatus.ACKED
        for entry in store.list(status=wanted, destination=target, limit=500):
            match = match_of(entry)
            if f"{match[0]}:{match[1]}" != target or match[2] not in self.by_number:
                continue
            if how == "redrive":
                store.redrive(entry.id)
            else:
                self._replay(entry, now)
            self.sim.judge.redriven(match)
            self.sim.judge.failed_seen.pop(entry.id, None)
            self.sim.out.faults[f"operator_{how}"] = \
                self.sim.out.faults.get(f"operator_{how}", 0) + 1
            self._owe(self.by_number[match[2]], now)

    def _replay(self, entry: Any, now: datetime) -> None:
        """The operator's replay of the entry's destination window (``sluice delivery
        replay``), through ``Replay`` as the API and the CLI run it."""
        from sluice.delivery.channels import Outbound
        from sluice.delivery.replay import Replay, parse_filter

        services = self.sim.services
        with Outbound.open(services.settings) as client:
            replay = Replay.from_services(services, client)
            flt = parse_filter({"destination": entry.destination,
                                "since": entry.enqueued_at.isoformat(),
                                "until": now.isoformat(), "status": "acked"},
                               channels=list(replay.adapters), now=now)
            replay.run(flt, dry_run=False)

    # --- the checks ----------------------------------------------------------------

    def _fair(self, arg: tuple[int, datetime, int]) -> None:
        number, due, extended = arg
        message = self.by_number[number]
        if self.due.get(number) != due:
            return  # owed again since (a redrive, a replay): that check judges it
        sim, now = self.sim, self.sim.clock.now()
        channel, recipient = message.destination.split(":", 1)
        match = (channel, recipient, number)
        if any(r.at >= due for r in sim.network.receipts_of.get(match, ())):
            self._chunks(message, match)
            return
        if any(w.start < now and due - timedelta(hours=1) < w.end
               for w in sim.world.outages.windows):
            return  # a store outage in between: the bound is not the drain's to keep
        crashed = sum(1 for at in sim.drain_crashes if due <= at <= now)
        if crashed > extended:  # each crashed run: one drain interval more; a claim it held
            # the entry in: a lease
            wait = (crashed - extended) * DRAIN_EVERY + (
                LEASE if sim.charges.held[match] or sim.charges.hits[match] else timedelta(0))
            sim._schedule(now + wait, "iso", ("check", (number, due, crashed)))
            return
        key = rate_key(message.destination)[0]
        sim.judge.fail("fair_share", now,
                       f"story-{number} -> {message.destination} (due {due:%H:%M:%S}) not "
                       f"received {now - due} later: one drain interval and {key}'s own "
                       "spacing; another destination's state held it")

    def _chunks(self, message: Message, match: tuple[str, str, int]) -> None:
        if message.parts <= 1:
            return
        parts = self.sim.network.parts.get(match, set())
        missing = sorted(set(range(1, message.parts + 1)) - parts)
        if missing:
            self.sim.judge.fail("chunks_whole", self.sim.clock.now(),
                                f"story-{message.number} -> {message.destination} was "
                                f"received without its part(s) {missing}")

    def _resumed(self) -> None:
        """After the operator resumed the group mid-run, its backlog is asked again within
        one drain interval and its spacing."""
        at = self.resumed_at
        if at is None:
            return
        asked = [t for t in self.group_asked if t >= at]
        crashed = any(at <= t for t in self.sim.drain_crashes)
        if not asked and not crashed:
            self.sim.judge.fail("resumed", self.sim.clock.now(),
                                f"{GROUP} was resumed at {at:%H:%M:%S} with its backlog "
                                "waiting, and nothing was sent to it since")

    def justified(self, key: str, failed_at: datetime | None) -> bool:
        """The operator had ``key`` disabled when its entry failed ``destination_disabled``."""
        return failed_at is not None and any(
            k == key and start <= failed_at and (end is None or failed_at < end)
            for k, start, end in self.disabled)

    def _probe(self) -> None:
        """``request_path_kept``: an app's call into a store that does not answer gives up
        within the request path's bound (``SLUICE_REQUEST_PATH_TIMEOUT_SECONDS``), in
        simulated time, however long the partition lasts."""
        from sluice import enqueue_delivery
        from sluice.core.errors import StoreError

        sim = self.sim
        started = sim.clock.now()
        bound = sim.services.settings.request_path_timeout_s
        with sim.outages.live():
            try:
                enqueue_delivery(sim.services, "telegram", "9001",
                                 {"payloads": ["a probe (no story)"], "silent": False})
                answer = "enqueued"
            except StoreError as exc:
                answer = type(exc).__name__
        took = (sim.clock.now() - started).total_seconds()
        sim._log(f"app enqueue in a partition: {answer} after {took:.1f} s")
        if took > bound + 0.01:
            sim.judge.fail("request_path_kept", sim.clock.now(),
                           f"an app's enqueue_delivery waited {took:.1f} s on a store that "
                           f"did not answer; its request path allows {bound:g} s")

    def _unknown(self) -> None:
        """The operator's two answers to an entry resting ``unknown`` (its sender died after
        each of its sends): send it again (owed from now), or mark it delivered (final)."""
        from bench.simulate.operator import match_of
        from sluice.delivery.store import DeliveryStatus, DeliveryStore

        sim, now = self.sim, self.sim.clock.now()
        store = DeliveryStore(sim.services.db)
        for target, how in ((UNKNOWN_SENT_AGAIN, "send_again"), (UNKNOWN_MARKED, "mark")):
            for entry in store.list(status=DeliveryStatus.UNKNOWN, destination=target,
                                    limit=500):
                match = match_of(entry)
                if how == "send_again":
                    store.send_again(entry.id)
                    sim.judge.redriven(match)
                    self._owe(self.by_number[match[2]], now)
                else:
                    store.mark_delivered(entry.id)
                    sim.judge.settled_for_good(match, now, "marked delivered by the operator")
                sim.out.faults[f"operator_{how}"] = sim.out.faults.get(f"operator_{how}", 0) + 1
                sim._log(f"operator {how} story-{match[2]} -> {target} (isolation)")

    def _purge(self) -> None:
        """The operator purges what the poison receiver failed for good."""
        from bench.simulate.operator import match_of
        from sluice.delivery.store import DeliveryStatus, DeliveryStore

        sim, now = self.sim, self.sim.clock.now()
        store = DeliveryStore(sim.services.db)
        for entry in store.list(status=DeliveryStatus.FAILED, destination=_key(POISONED_LATE),
                                limit=500):
            match = match_of(entry)
            store.purge(entry.id)
            sim.judge.final[match] = (now, "purged by the operator")
            sim.judge.failed_seen.pop(entry.id, None)
            sim.out.faults["operator_purge"] = sim.out.faults.get("operator_purge", 0) + 1
            sim._log(f"operator purged story-{match[2]} -> {POISONED_LATE} (isolation)")


def _key(destination: str) -> str:
    from bench.simulate.operator import destination_of

    return destination_of(*destination.split(":", 1))
