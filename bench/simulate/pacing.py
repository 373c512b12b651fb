"""How Sluice's requests to each destination are spaced, judged from what the simulated
peers recorded (``Network.requests``), never from Sluice's queue or its rate keys.

- ``rate_kept``: no window of a limit's period holds more requests that reached the peer
  than the limit plus one (the documented bound of ``sluice.delivery.ratelimit``: sends are
  spaced at the limit's interval, so only the one on the window's closing edge may be
  extra). The limits are the providers' documented ones, which are Sluice's defaults:
  Telegram 30 a second per bot, 1 a second per chat, 20 a minute per group (a negative
  chat id); Slack 1 a second per channel; a webhook host (its host and port) 10 a second.
- ``spacing_kept``: two messages to a limit's key that reached the peer are never closer
  than the limit's own interval (its period over its limit: 3 s for a Telegram group, 1 s
  for a chat or a Slack channel, 100 ms for a webhook host), as
  ``sluice.delivery.ratelimit`` documents ("no bursts; no two messages are ever closer
  than the limit's own interval"). Requests of one message (its in-process retries, its
  chunks) are not two messages.
- ``timeout_kept``: every request to a destination is given the whole send timeout
  (``SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS``, 10 s) to be answered: the drain claims an
  entry, and a retry waits, only while a whole send still fits before the run's deadline
  (``sluice.delivery.drain``, ``sluice.delivery.retry``). The peer sees how long the
  client waits: a request cut to the deadline would turn an answer that was coming into
  an unknown outcome.
- ``schedule_kept``: a destination that failed (connection refused, 429) is asked again
  only as the documented schedule allows: within one send, at most
  ``INPROCESS_ATTEMPTS`` requests, each retry after the in-process policy's delay (300 ms
  doubling) or the ``Retry-After`` the peer gave; the next send after the destination's
  n-th failed send in a row no sooner than the queue's step n (5 s, 25 s, 2 min, 10 min,
  then every 10 min), nor before the ``Retry-After`` the peer gave, capped at the
  schedule's last step. A 429 whose ``Retry-After`` is honoured (up to the pacing cap,
  an hour) is the provider's pacing, not the destination failing (the policy's "pacing
  answer" row): it holds the next send for its wait and counts no failure (seeds 8 and 10
  x 365 showed it: a chat paced for hours, then refusing, was probed a minute later, as
  documented). An answer starts it over, a pacing answer included: a destination that
  refused connections and then answers 429 is up and pacing, so its next send waits the
  ``Retry-After`` it named, not the step of the refusals before it (seed 71 x 365 showed
  it: a receiver down for hours, then paced hourly, then asking for 312 s, was asked again
  360 s later, which the model had judged against the 600 s step of the earlier refusals). A different match sent in the same instant (a drain working
  through a backlog to a destination that took an entry earlier in the run) starts a
  send of its own. A webhook's destination is its receiver's host and port (each
  simulated receiver has a port of its own, ``hosts.hook_host``): a destination that
  shared one host's schedule among receivers failing on their own windows would resend
  one hook on another's probe.
"""

from __future__ import annotations

import os
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple

from bench.simulate.hosts import hook_host

if TYPE_CHECKING:
    from bench.simulate.invariants import Judge

SCHEDULE_S = (5.0, 25.0, 120.0, 600.0)  # docs/delivery.md: the queue's retry schedule
INPROCESS_ATTEMPTS = 3  # sluice.delivery.retry.RetryPolicy: 3 attempts, 300 ms doubling
INPROCESS_FIRST_S = 0.3
INPROCESS_MAX_S = 30.0
SLACK_S = 0.05  # the simulated clock's own rounding: a wait may end this much early
FAILED = ("down", "ratelimit")
PACING_CAP_S = 3600.0  # docs/delivery.md: the longest provider wait honoured
TIMED_OUT = ("late", "hang")  # the request left and no answer came: an unknown outcome


def send_timeout_s() -> float:
    """The documented send timeout the deployment runs with."""
    return float(os.environ.get("SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS", "10"))


class Request(NamedTuple):
    at: datetime
    channel: str
    recipient: str
    story: int
    answer: str  # up | late | hang | down | ratelimit | refuse | error (a 500) | ...
    retry_after_s: float | None  # what a 429 asked for
    timeout_s: float | None = None  # how long the client waits for the answer


def limits(channel: str, recipient: str) -> list[tuple[str, int, float]]:
    """(key, limit, period in seconds) of every provider limit a request counts against."""
    if channel == "telegram":
        chat = (f"telegram:chat:{recipient}", 20, 60.0) if recipient.startswith("-") \
            else (f"telegram:chat:{recipient}", 1, 1.0)
        return [("telegram:bot", 30, 1.0), chat]
    if channel == "slack":
        return [(f"slack:channel:{recipient}", 1, 1.0)]
    return [(f"webhook:host:{hook_host(recipient)}", 10, 1.0)]


def destination(channel: str, recipient: str) -> str:
    """What fails together: a chat, a channel, a webhook receiver's host and port."""
    return f"webhook:{hook_host(recipient)}" if channel == "webhook" else f"{channel}:{recipient}"


@dataclass
class _Failing:
    sends: int = 0  # the destination's failed sends in a row (not those a 429 paced)
    in_send: int = 0  # requests of the current send
    last_at: datetime | None = None
    story: int = -1
    retry_after_s: float | None = None
    failing: bool = False  # the current send failed as the destination's (not paced)


@dataclass
class Pacing:
    judge: Judge
    windows: dict[str, deque[datetime]] = field(default_factory=dict)
    asked: Counter[tuple[str, str, int]] = field(default_factory=Counter)  # match -> requests
    failing: dict[str, _Failing] = field(default_factory=dict)
    # key -> (when, story) of the last message that reached the peer (spacing_kept)
    last_message: dict[str, tuple[datetime, int]] = field(default_factory=dict)
    last_of_match: dict[tuple[str, str, int], datetime] = field(default_factory=dict)

    def request(self, request: Request) -> None:
        match = (request.channel, request.recipient, request.story)
        self.asked[match] += 1
        if request.answer in TIMED_OUT:
            self.judge.unknown_sends[match] += 1
        self._timeout(request)
        if request.answer != "down":  # a refused connection reached no one
            self._rate(request)
        self._schedule(request)
        self.last_of_match[match] = request.at

    def _timeout(self, request: Request) -> None:
        wanted = send_timeout_s()
        if request.timeout_s is not None and request.timeout_s + SLACK_S < wanted:
            self.judge.fail("timeout_kept", request.at,
                            f"{destination(request.channel, request.recipient)} was asked for "
                            f"story-{request.story} with {request.timeout_s:.1f} s to answer "
                            f"(the send timeout is {wanted:g} s: a send started with less "
                            "than a whole send left before the deadline)")

    def _rate(self, request: Request) -> None:
        match = (request.channel, request.recipient, request.story)
        previous = self.last_of_match.get(match)
        # a request of the same message soon after its last (an in-process retry, a
        # further chunk) is that message's, not another one
        retry = previous is not None and (request.at - previous).total_seconds() \
            <= INPROCESS_MAX_S + 1
        for key, limit, period in limits(request.channel, request.recipient):
            interval = period / limit
            last = self.last_message.get(key)
            if last is not None and last[1] != request.story:
                gap = (request.at - last[0]).total_seconds()
                if gap + SLACK_S < interval:
                    self.judge.fail("spacing_kept", request.at,
                                    f"{key}: story-{request.story} {gap:.2f} s after "
                                    f"story-{last[1]} (the limit's interval is "
                                    f"{interval:g} s: {limit} in {period:g} s)")
            if last is None or last[1] != request.story or not retry:
                self.last_message[key] = (request.at, request.story)
            seen = self.windows.setdefault(key, deque())
            seen.append(request.at)
            while seen and seen[0] <= request.at - timedelta(seconds=period):
                seen.popleft()
            if len(seen) > limit + 1:
                self.judge.fail("rate_kept", request.at,
                                f"{key}: {len(seen)} requests within {period:g} s (limit "
                                f"{limit}, story-{request.story})")

    def _schedule(self, request: Request) -> None:
        key = destination(request.channel, request.recipient)
        state = self.failing.get(key)
        if state is not None and state.last_at is not None:
            gap = (request.at - state.last_at).total_seconds()
            new_send = self._new_send(state, request, gap)
            if new_send is None:
                return
            if new_send:
                state.sends += state.failing
                state.in_send = 0
                state.failing = False
        if request.answer in FAILED:
            state = self.failing.setdefault(key, _Failing())
            state.in_send += 1
            state.last_at = request.at
            state.story = request.story
            state.retry_after_s = request.retry_after_s
            paced = request.retry_after_s is not None and request.retry_after_s <= PACING_CAP_S
            if paced:  # an answer, pacing: the streak of failures before it is over
                state.sends = 0
            state.failing = not paced
        elif request.answer in ("up", "late"):
            self.failing.pop(key, None)  # it answered: the schedule starts over

    def _new_send(self, state: _Failing, request: Request, gap: float) -> bool | None:
        """Whether ``request`` (``gap`` seconds after the last failed one) starts a send of
        its own (False: a retry within the send); None once a violation was recorded."""
        asked = state.retry_after_s
        if gap <= SLACK_S and request.story != state.story:
            return True  # another entry of the same run: a send of its own
        if state.in_send < INPROCESS_ATTEMPTS:
            wanted = INPROCESS_FIRST_S * 2 ** (state.in_send - 1)
            if asked is not None:
                wanted = max(wanted, asked)
            if wanted <= INPROCESS_MAX_S and wanted - SLACK_S <= gap <= INPROCESS_MAX_S + 1:
                return False
        failed = state.sends + state.failing  # the destination's failed sends in a row
        step = SCHEDULE_S[min(failed, len(SCHEDULE_S)) - 1] if failed else 0.0
        wanted = max(step, min(asked, SCHEDULE_S[-1])) if asked is not None else step
        if gap + SLACK_S < wanted:
            self.judge.fail("schedule_kept", request.at,
                            f"{destination(request.channel, request.recipient)} asked again "
                            f"{gap:.1f} s after its failed send {failed} in a row "
                            f"(the schedule waits {wanted:g} s; story-{request.story})")
            return None
        return True
