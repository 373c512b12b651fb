"""Whose an answered failure is: the entry's, or its receiver's (``no_attempt_burned``).

A receiver that answers a failure (a 500) to one entry alone names that entry: the send
counts an attempt. Once a second entry is answered a failure there before any success, the
receiver is what fails: Sluice holds it as failing, counts nothing against the entries it
answers meanwhile, and gives back the attempt the first one's send counted
(``Destinations.spread``). ``Streaks`` follows that rule from what the receivers answered,
per receiver (a webhook's host and port), and keeps per match how many of its requests no
attempt may stand for (``uncounted``): its answered failures, less its sends that failed
alone and were not given back. A send is the requests of one entry within
``SAME_SEND`` of each other (the in-process retries: 300 ms doubling, three tries).

The receiver's success ends a streak. A crash right after a send undoes that request's
step (``undo``): Sluice never concluded it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from bench.simulate.invariants import Match
from bench.simulate.operator import destination_of
from bench.simulate.pacing import Request

FAILED = "error"  # a receiver's answered failure (a 500): a poison entry or an answered outage
SUCCEEDED = "up"
SAME_SEND = timedelta(seconds=2.5)  # the in-process retries' gaps are 0.3 s and 0.6 s


@dataclass
class _Receiver:
    held: bool = False  # a second entry failed: the receiver is what fails
    suspect: Match | None = None  # the entry whose answered failure alone names it
    last: datetime | None = None  # the suspect's last failed request


@dataclass
class Streaks:
    receivers: dict[str, _Receiver] = field(default_factory=dict)
    failures: Counter[Match] = field(default_factory=Counter)  # answered failures
    lone: Counter[Match] = field(default_factory=Counter)  # sends that failed alone, counted
    undo_to: tuple[str, _Receiver, Counter[Match], Counter[Match]] | None = None

    def request(self, request: Request) -> None:
        match = (request.channel, request.recipient, request.story)
        key = destination_of(request.channel, request.recipient)
        now = self.receivers.get(key, _Receiver())
        self.undo_to = (key, now, self.failures.copy(), self.lone.copy())
        if request.answer == SUCCEEDED:
            self.receivers[key] = _Receiver()
        elif request.answer == FAILED:
            self.failures[match] += 1
            self.receivers[key] = self._failed(now, match, request.at)

    def _failed(self, now: _Receiver, match: Match, at: datetime) -> _Receiver:
        if now.held:
            return now
        if now.suspect is None or now.suspect == match:
            if now.last is None or at - now.last > SAME_SEND:
                self.lone[match] += 1  # a send of its own, counted against it
            return _Receiver(suspect=match, last=at)
        self.lone[now.suspect] -= 1  # the receiver's after all: given back
        return _Receiver(held=True)

    def uncounted(self, match: Match) -> int:
        """The requests of ``match`` no attempt may stand for: the receiver's failures."""
        return self.failures[match] - self.lone[match]

    def undo(self) -> None:
        """The last request's sender died before concluding it: Sluice never learnt of it."""
        if self.undo_to is not None:
            key, receiver, self.failures, self.lone = self.undo_to
            self.receivers[key] = receiver
            self.undo_to = None
