"""Alert rules: a tenant scope's list, stored whole in the state store.

Key ``platform:alerts-rules:<scopeId>``, value ``{"rules": [...], "updatedAt": iso}``.
A rule::

    {"id": "breach", "name": "Data breaches", "enabled": true,
     "match": {"keywords": ["data breach", "ransomware"],     # any of them, required
               "sources": ["src-1"],                          # optional: of the scope's
               "publishedAfter": "2026-01-01T00:00:00Z"},     # optional
     "destination": {"channel": "slack", "recipient": "C0123",
                     "accountId": null, "threadId": null, "silent": false}}

A keyword is a word or phrase matched on word boundaries in the story's title and
summary, ignoring case and accents ("Resume" matches "résumé").
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from sluice.core.errors import NotFound, RequestError
from sluice.core.validate import (
    check_optional_identifier,
    check_scope_id,
    check_text,
)
from sluice.delivery.channels import channels, check_recipient, webhook_guard
from sluice.egress import AddressGuard
from sluice.rss.store import RssStore, Story
from sluice.store.db import utcnow
from sluice.store.state import StateStore

if TYPE_CHECKING:
    from sluice.core.services import Services

PREFIX = "platform:alerts-rules:"
MAX_RULES = 100
MAX_KEYWORDS = 50
MAX_KEYWORD = 200
MAX_TEXT = 512
RULE_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
RULE_KEYS = frozenset({"id", "name", "enabled", "match", "destination"})
MATCH_KEYS = frozenset({"keywords", "sources", "publishedAfter"})
DESTINATION_KEYS = frozenset({"channel", "recipient", "accountId", "threadId", "silent"})
_NON_WORD = re.compile(r"[^\w]+")


def normalise(text: str) -> str:
    """Case- and accent-free words separated by single spaces, with a space at each end (so
    a phrase matches on word boundaries with ``in``)."""
    decomposed = unicodedata.normalize("NFKD", text)
    bare = "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()
    return " " + _NON_WORD.sub(" ", bare).replace("_", " ").strip() + " "


def story_text(story: Story) -> str:
    return _story_text(story.title, story.summary)


# A warm process meets the same stories on every sweep (each build holds up to 500):
# each one's text is normalised once, not on every tick.
@lru_cache(maxsize=4096)
def _story_text(title: str, summary: str) -> str:
    return normalise(f"{title} {summary}")


@dataclass(frozen=True)
class Destination:
    channel: str
    recipient: str
    account_id: str | None = None
    thread_id: str | None = None
    silent: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"channel": self.channel, "recipient": self.recipient,
                "accountId": self.account_id, "threadId": self.thread_id,
                "silent": self.silent}


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    enabled: bool
    keywords: tuple[str, ...]
    destination: Destination
    sources: frozenset[str] | None = None
    published_after: datetime | None = None

    @property
    def phrases(self) -> tuple[str, ...]:
        return tuple(normalise(k) for k in self.keywords)

    def to_json(self) -> dict[str, Any]:
        match: dict[str, Any] = {"keywords": list(self.keywords)}
        if self.sources is not None:
            match["sources"] = sorted(self.sources)
        if self.published_after is not None:
            match["publishedAfter"] = self.published_after.isoformat().replace("+00:00", "Z")
        return {"id": self.id, "name": self.name, "enabled": self.enabled, "match": match,
                "destination": self.destination.to_json()}


class Matcher:
    """One rule ready to test against prepared stories."""

    __slots__ = ("after", "phrases", "rule", "sources")

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.phrases = rule.phrases
        self.sources = rule.sources
        self.after = rule.published_after

    def matches(self, story: Story, text: str) -> bool:
        if self.sources is not None and story.source_id not in self.sources:
            return False
        if self.after is not None and (story.published_at is None
                                       or story.published_at < self.after):
            return False
        for phrase in self.phrases:
            if phrase in text:
                return True
        return False


# --- validation -----------------------------------------------------------------


def _bad(field: str, message: str) -> RequestError:
    return RequestError(f"{field}: {message}", field=field)


def _unknown(body: dict[str, Any], allowed: frozenset[str], field: str) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise _bad(f"{field}.{extra[0]}" if field else extra[0], "unknown field")


def parse_rule(body: Any, field: str, scope_sources: tuple[str, ...] | None) -> Rule:
    if not isinstance(body, dict):
        raise _bad(field, "must be an object")
    _unknown(body, RULE_KEYS, field)
    rule_id = body.get("id")
    if not isinstance(rule_id, str) or not RULE_ID.fullmatch(rule_id):
        raise _bad(f"{field}.id", "must be 1 to 64 of A-Z a-z 0-9 _ . -")
    name = check_text(body.get("name", rule_id), field=f"{field}.name", limit=MAX_TEXT)
    enabled = body.get("enabled", True)
    if not isinstance(enabled, bool):
        raise _bad(f"{field}.enabled", "must be true or false")
    match = body.get("match")
    if not isinstance(match, dict):
        raise _bad(f"{field}.match", "must be an object")
    _unknown(match, MATCH_KEYS, f"{field}.match")
    keywords = match.get("keywords")
    if not isinstance(keywords, list) or not keywords:
        raise _bad(f"{field}.match.keywords", "must be a non-empty list of words or phrases")
    if len(keywords) > MAX_KEYWORDS:
        raise _bad(f"{field}.match.keywords", f"at most {MAX_KEYWORDS}")
    for k, keyword in enumerate(keywords):
        check_text(keyword, field=f"{field}.match.keywords[{k}]", limit=MAX_KEYWORD)
        if not normalise(keyword).strip():
            raise _bad(f"{field}.match.keywords[{k}]", "has no letters or digits")
    sources: frozenset[str] | None = None
    if match.get("sources") is not None:
        listed = match["sources"]
        if not isinstance(listed, list) or not listed:
            raise _bad(f"{field}.match.sources", "must be a non-empty list of source ids")
        if scope_sources is None:
            raise _bad(f"{field}.match.sources", "the scope does not exist; a source subset "
                       "needs the scope's sources")
        for s, source in enumerate(listed):
            if source not in scope_sources:
                raise _bad(f"{field}.match.sources[{s}]",
                           f"{source!r} is not one of the scope's sources")
        sources = frozenset(listed)
    after: datetime | None = None
    if match.get("publishedAfter") is not None:
        raw = match["publishedAfter"]
        try:
            after = datetime.fromisoformat(str(raw))
        except ValueError:
            raise _bad(f"{field}.match.publishedAfter", "must be an ISO 8601 time") from None
        after = after if after.tzinfo else after.replace(tzinfo=UTC)
    destination = body.get("destination")
    if not isinstance(destination, dict):
        raise _bad(f"{field}.destination", "must be an object")
    _unknown(destination, DESTINATION_KEYS, f"{field}.destination")
    channel = destination.get("channel")
    if channel not in channels():
        raise _bad(f"{field}.destination.channel",
                   f"unknown channel {channel!r}; known: {', '.join(channels())}")
    recipient = check_recipient(str(channel), destination.get("recipient"),
                                field=f"{field}.destination.recipient")
    silent = destination.get("silent", False)
    if not isinstance(silent, bool):
        raise _bad(f"{field}.destination.silent", "must be true or false")
    return Rule(
        id=rule_id, name=name, enabled=enabled,
        keywords=tuple(keywords), sources=sources, published_after=after,
        destination=Destination(
            channel=str(channel), recipient=recipient,
            account_id=check_optional_identifier(destination.get("accountId"),
                                                 field=f"{field}.destination.accountId"),
            thread_id=check_optional_identifier(destination.get("threadId"),
                                                field=f"{field}.destination.threadId"),
            silent=silent))


def parse_rules(body: Any, scope_sources: tuple[str, ...] | None) -> list[Rule]:
    """The whole list from a request body (``{"rules": [...]}`` or a bare list)."""
    if isinstance(body, dict):
        _unknown(body, frozenset({"rules"}), "")
        body = body.get("rules")
    if not isinstance(body, list):
        raise _bad("rules", "must be a list of rules")
    if len(body) > MAX_RULES:
        raise _bad("rules", f"at most {MAX_RULES} rules per scope")
    rules = [parse_rule(item, f"rules[{n}]", scope_sources) for n, item in enumerate(body)]
    seen: set[str] = set()
    for n, rule in enumerate(rules):
        if rule.id in seen:
            raise _bad(f"rules[{n}].id", f"duplicate rule id {rule.id!r}")
        seen.add(rule.id)
    return rules


# --- storage ----------------------------------------------------------------------


def rules_key(scope_id: str) -> str:
    return PREFIX + scope_id


def load_rules(value: Any) -> list[Rule]:
    """Stored rules (already validated when written; sources are not re-checked). Each
    tick reads every scope's rules twice or more: the same stored text is parsed once."""
    if not isinstance(value, dict):
        return []
    return list(_load_stored(json.dumps(value.get("rules") or [], sort_keys=True)))


@lru_cache(maxsize=1024)
def _load_stored(text: str) -> tuple[Rule, ...]:  # rules are frozen: safe to share
    return tuple(_stored_rule(item, f"rules[{n}]") for n, item in enumerate(json.loads(text)))


def _stored_rule(item: Any, field: str) -> Rule:
    sources = (item.get("match") or {}).get("sources") if isinstance(item, dict) else None
    return parse_rule(item, field, tuple(sources) if sources else None)


def check_webhook_recipients(rules: list[Rule], guard: AddressGuard) -> None:
    """Refuse a webhook recipient the sender would refuse, at save time (no DNS: a name's
    addresses are checked again at every connection)."""
    for n, rule in enumerate(rules):
        if rule.destination.channel == "webhook":
            guard.check_url(rule.destination.recipient,
                            field=f"rules[{n}].destination.recipient")


class RulesStore:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.state = StateStore(services.db)

    def scope_ids(self) -> list[str]:
        return [key[len(PREFIX):] for key in self.state.keys_with_prefix(PREFIX)]

    def get(self, scope_id: str) -> list[Rule]:
        return load_rules(self.state.get(rules_key(check_scope_id(scope_id))))

    def put(self, scope_id: str, body: Any, *, now: datetime | None = None) -> list[Rule]:
        check_scope_id(scope_id)
        try:
            scope_sources: tuple[str, ...] | None = RssStore(self.services.db).scope(
                scope_id).source_ids
        except NotFound:
            scope_sources = None
        rules = parse_rules(body, scope_sources)
        check_webhook_recipients(rules, webhook_guard(self.services.settings.webhook_allow_hosts))
        now = now or utcnow()
        self.state.put(rules_key(scope_id), {
            "rules": [r.to_json() for r in rules],
            "updatedAt": now.isoformat().replace("+00:00", "Z")}, now=now)
        return rules


def rules_body(scope_id: str, rules: list[Rule]) -> dict[str, Any]:
    return {"scopeId": scope_id, "rules": [r.to_json() for r in rules]}
