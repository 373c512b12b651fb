"""Rule validation (a 400 naming the field) and matching: keywords and phrases on word
boundaries, case- and accent-insensitive, the source subset and the minimum time."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from sluice.alerts.evaluate import match_key
from sluice.alerts.rules import Matcher, normalise, parse_rules, story_text
from sluice.core.errors import RequestError
from sluice.rss.store import Story


def rule(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "r1", "name": "Breaches", "enabled": True,
        "match": {"keywords": ["data breach", "Résumé"]},
        "destination": {"channel": "slack", "recipient": "C0ALERTS"}}
    body.update(overrides)
    return body


def story(title: str, summary: str = "", source: str = "s1",
          published: datetime | None = None) -> Story:
    return Story(id=f"id-{title}", title=title, link=None, published_at=published,
                 summary=summary, source_id=source)


def matcher(**overrides: Any) -> Matcher:
    return Matcher(parse_rules([rule(**overrides)], ("s1", "s2"))[0])


def test_normalise_drops_case_accents_and_punctuation() -> None:
    assert normalise("  Crème-BRÛLÉE, résumé!  ") == " creme brulee resume "


@pytest.mark.parametrize(("title", "summary", "expected"), [
    ("A DATA   Breach at ACME", "", True),          # case and spacing
    ("", "the resume of a data-breach", True),       # summary, punctuation between words
    ("RESUME updated", "", True),                     # accent-insensitive
    ("Databreach", "", False),                        # whole words only
    ("data breaches everywhere", "", False),          # a phrase is not a prefix
    ("Nothing here", "", False),
])
def test_keywords_and_phrases_match_on_word_boundaries(title: str, summary: str,
                                                       expected: bool) -> None:
    s = story(title, summary)
    assert matcher().matches(s, story_text(s)) is expected


def test_source_subset_and_minimum_published_time() -> None:
    after = datetime(2026, 1, 1, tzinfo=UTC)
    m = matcher(match={"keywords": ["breach"], "sources": ["s2"],
                       "publishedAfter": "2026-01-01T00:00:00Z"})
    ok = story("breach", source="s2", published=after)
    assert m.matches(ok, story_text(ok))
    other = story("breach", source="s1", published=after)
    assert not m.matches(other, story_text(other))
    old = story("breach", source="s2", published=datetime(2025, 12, 31, tzinfo=UTC))
    assert not m.matches(old, story_text(old))
    undated = story("breach", source="s2")
    assert not m.matches(undated, story_text(undated))


@pytest.mark.parametrize(("body", "field"), [
    ({"rules": "x"}, "rules"),
    ({"rules": [], "extra": 1}, "extra"),
    ([rule(id="bad id")], "rules[0].id"),
    ([rule(), rule()], "rules[1].id"),
    ([rule(enabled="yes")], "rules[0].enabled"),
    ([rule(match={"keywords": []})], "rules[0].match.keywords"),
    ([rule(match={"keywords": ["ok", "!!"]})], "rules[0].match.keywords[1]"),
    ([rule(match={"keywords": ["ok"], "color": "red"})], "rules[0].match.color"),
    ([rule(match={"keywords": ["ok"], "sources": ["s1", "nope"]})],
     "rules[0].match.sources[1]"),
    ([rule(match={"keywords": ["ok"], "publishedAfter": "yesterday"})],
     "rules[0].match.publishedAfter"),
    ([rule(destination={"channel": "pigeon", "recipient": "x"})],
     "rules[0].destination.channel"),
    ([rule(destination={"channel": "slack"})], "rules[0].destination.recipient"),
    ([rule(destination={"channel": "slack", "recipient": "C1", "silent": 1})],
     "rules[0].destination.silent"),
    ([rule(destination={"channel": "slack", "recipient": "C1", "cc": "x"})],
     "rules[0].destination.cc"),
])
def test_invalid_rules_name_the_field(body: Any, field: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_rules(body, ("s1", "s2"))
    assert caught.value.context["field"] == field
    assert caught.value.status == 400


def test_a_source_subset_needs_the_scope() -> None:
    with pytest.raises(RequestError) as caught:
        parse_rules([rule(match={"keywords": ["x"], "sources": ["s1"]})], None)
    assert caught.value.context["field"] == "rules[0].match.sources"


def test_rules_round_trip_through_json() -> None:
    parsed = parse_rules({"rules": [rule(match={"keywords": ["a b"], "sources": ["s1"],
                                                "publishedAfter": "2026-01-01T00:00:00Z"})]},
                         ("s1",))
    again = parse_rules([r.to_json() for r in parsed], ("s1",))
    assert again == parsed


def test_the_match_key_depends_on_scope_rule_and_story_only() -> None:
    key = match_key("scope-1", "r1", "story-9")
    assert key == match_key("scope-1", "r1", "story-9")
    assert len({key, match_key("scope-2", "r1", "story-9"), match_key("scope-1", "r2", "story-9"),
                match_key("scope-1", "r1", "story-8")}) == 4
    assert key.startswith("alert:") and len(key) <= 256
