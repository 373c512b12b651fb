"""Rules against stories, and each match onto the delivery queue exactly once.

The delivery entry's idempotency key is derived from (scope, rule id, story id): the
queue's unique index on ``idempotency_key`` makes a second enqueue of the same match
(a concurrent evaluation, a re-run tick, the after-response evaluation and the sweep
both seeing it) return the stored entry instead of adding one, and a redriven entry is
the same row sent again. The match's effect record (``delivery_effects``, written with
the entry) outlives the entry: once enqueued, a match is never enqueued again, however
long ago and whatever the delivery retention or an operator's purge did to its entry
(``sluice.alerts.effects`` prunes records only when their story is gone). Editing a rule,
or deleting it and creating one with the same id, keeps its id: a story it already
matched is not delivered again.
"""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from sluice.alerts.effects import PRODUCER, TOUCH_EVERY, touch_effects
from sluice.alerts.rules import Matcher, Rule, RulesStore, story_text
from sluice.core import trace
from sluice.core.after import run_after_response
from sluice.core.errors import SluiceError
from sluice.core.observe import logger
from sluice.delivery.drain import check_enqueue
from sluice.delivery.store import DeliveryStore, Effect
from sluice.rss.store import CatalogBuild, Story
from sluice.store.db import utcnow

if TYPE_CHECKING:
    from sluice.core.services import Services

KEY_PREFIX = "alert:"


def match_key(scope_id: str, rule_id: str, story_id: str) -> str:
    """The delivery idempotency key of one (rule, story) match."""
    digest = hashlib.sha256(f"{scope_id}\x1f{rule_id}\x1f{story_id}".encode()).hexdigest()
    return KEY_PREFIX + digest


class Prepared(NamedTuple):
    """A story with its normalised text, computed once per build."""

    story: Story
    text: str


def prepare(stories: Iterable[Story]) -> list[Prepared]:
    return [Prepared(story, story_text(story)) for story in stories]


_TAG = re.compile(r"<[^>]*>")


def plain(html_text: str) -> str:
    """A story summary (sanitised HTML) as plain text for the channels' converters."""
    return " ".join(html.unescape(_TAG.sub(" ", html_text)).split())


def payload(scope_id: str, rule: Rule, story: Story) -> dict[str, Any]:
    """One part: the title in bold, the link, the summary as plain text (each channel
    converts and chunks it to its own limits)."""
    lines = [f"**{story.title}**"]
    if story.link:
        lines.append(story.link)
    summary = plain(story.summary)
    if summary:
        lines += ["", summary]
    destination = rule.destination
    body: dict[str, Any] = {"payloads": ["\n".join(lines)], "silent": destination.silent}
    if destination.account_id:
        body["accountId"] = destination.account_id
    if destination.thread_id:
        body["threadId"] = destination.thread_id
    if destination.channel == "webhook":  # the free-form channel also gets the match itself
        body["alert"] = {"scopeId": scope_id, "ruleId": rule.id, "ruleName": rule.name,
                         "story": story.to_json()}
    return body


class EvaluationFailed(SluiceError):
    """Some scopes' rules could not be evaluated (the others were)."""


class Outcome(NamedTuple):
    evaluations: int  # (rule, story) pairs tested
    matched: int
    enqueued: int  # new delivery entries (a match already enqueued is not counted)


def evaluate(services: Services, scope_id: str, rules: Sequence[Rule],
             stories: Sequence[Prepared], *, deliveries: DeliveryStore | None = None,
             parent: trace.Carrier | None = None) -> Outcome:
    """Test every enabled rule against every story; enqueue the matches not yet stored (a
    match already on the queue is skipped with one read, and the unique key still guards
    a race between the read and the insert). The span ``alerts match``, a child of
    ``parent`` (a sweep's worker thread has no current span of its own)."""
    with trace.span("alerts match", parent=parent, attributes={
            "sluice.scope_id": scope_id, "sluice.rules": len(rules),
            "sluice.stories": len(stories)}) as span:
        outcome = _evaluate(services, scope_id, rules, stories,
                            deliveries or DeliveryStore(services.db))
        span.set("sluice.matched", outcome.matched)
        span.set("sluice.enqueued", outcome.enqueued)
        return outcome


def _evaluate(services: Services, scope_id: str, rules: Sequence[Rule],
              stories: Sequence[Prepared], deliveries: DeliveryStore) -> Outcome:
    evaluations = 0
    matches: list[tuple[Rule, Story, str]] = []
    for rule in rules:
        if not rule.enabled:
            continue
        matcher = Matcher(rule)
        for prepared in stories:
            evaluations += 1
            if matcher.matches(prepared.story, prepared.text):
                matches.append((rule, prepared.story,
                                match_key(scope_id, rule.id, prepared.story.id)))
    keys = [key for _, _, key in matches]
    seen = deliveries.effects_seen(keys)
    # Entries enqueued before effect records existed are recognised by their rows.
    known = set(seen) | deliveries.known_keys([key for key in keys if key not in seen])
    now = utcnow()
    stale = sorted(key for key, at in seen.items() if at < now - TOUCH_EVERY)
    if stale:  # the write only when a record is due for it (most ticks: none)
        touch_effects(services.db, stale, now=now)
    enqueued = 0
    for rule, story, key in matches:
        if key in known:
            continue
        body = payload(scope_id, rule, story)
        check_enqueue(rule.destination.channel, body)
        _, created = deliveries.enqueue(rule.destination.channel, rule.destination.recipient,
                                        body, idempotency_key=key,
                                        effect=Effect(PRODUCER, scope_id, story.id))
        enqueued += created
    return Outcome(evaluations, len(matches), enqueued)


def evaluate_new_stories(services: Services, build: CatalogBuild, new: Sequence[Story],
                         scope_ids: Sequence[str]) -> Outcome:
    """The rules of every scope sharing ``build`` against its new stories; a failing scope
    does not stop the others, and the failures are raised together at the end."""
    store = RulesStore(services)
    prepared = prepare(new)
    total = Outcome(0, 0, 0)
    failures: list[str] = []
    for scope_id in scope_ids:
        try:
            rules = store.get(scope_id)
            if any(rule.enabled for rule in rules):
                got = evaluate(services, scope_id, rules, prepared)
                total = Outcome(*(a + b for a, b in zip(total, got, strict=True)))
        except Exception as exc:  # noqa: BLE001 - one scope's failure never stops the others
            failures.append(f"{scope_id}: {exc}")
    if failures:
        raise EvaluationFailed(f"{len(failures)} scope(s) failed: " + "; ".join(failures))
    return total


def on_new_stories(services: Services, build: CatalogBuild, new: list[Story],
                   scope_ids: list[str], now: bool = False) -> int | None:
    """The catalog's listener: evaluation after the response (see ``sluice.core.after``),
    or at once when ``now`` (a tick, whose answer counts what it enqueued)."""
    if now:
        return evaluate_new_stories(services, build, new, scope_ids).enqueued

    def failed(exc: BaseException) -> None:
        logger.error(f"[alerts] new-story evaluation failed for {build.key}: {exc}")

    run_after_response(lambda: evaluate_new_stories(services, build, new, scope_ids), failed,
                       reporter=services.reporter)
    return None
