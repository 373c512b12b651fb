"""Chunking on paragraph, line and word boundaries, measured after each platform's
conversion, and the conversions' escaping."""

from __future__ import annotations

import pytest

from sluice.delivery.chunking import (
    TELEGRAM_MAX_TEXT,
    chunk,
    plain,
    to_html,
    to_slack_mrkdwn,
    to_telegram_html,
)


def test_a_text_that_fits_is_one_chunk_converted() -> None:
    assert chunk("a < b & **c**", 100, to_telegram_html) == ["a &lt; b &amp; <b>c</b>"]


def test_paragraphs_first() -> None:
    text = "aaaa bbbb\n\ncccc dddd\n\neeee"
    assert chunk(text, 20) == ["aaaa bbbb\n\ncccc dddd", "eeee"]


def test_then_lines_then_words() -> None:
    assert chunk("one two three\nfour five", 10) == ["one two", "three", "four five"]
    assert chunk("alpha beta gamma delta", 11) == ["alpha beta", "gamma delta"]


def test_a_word_longer_than_the_limit_is_cut() -> None:
    assert chunk("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]


def test_escaping_counts_against_the_limit() -> None:
    pieces = chunk("& " * 30, 20, to_telegram_html)
    assert all(len(p) <= 20 for p in pieces)
    assert "".join(p.replace("&amp;", "&") for p in pieces).replace(" ", "") == "&" * 30


@pytest.mark.parametrize("limit", [50, 100, 4096])
def test_nothing_is_lost_or_reordered(limit: int) -> None:
    text = "\n\n".join(f"paragraph {i}: " + "word " * (i * 7) for i in range(40))
    pieces = chunk(text, limit)
    assert all(len(p) <= limit for p in pieces)
    assert " ".join(pieces).split() == text.split()


def test_a_mark_split_across_chunks_stays_literal() -> None:
    assert chunk("**bold words here**", 10, to_slack_mrkdwn) == ["**bold", "words", "here**"]


def test_each_platform_gets_its_markup() -> None:
    text = "**db-1** <full> & `df -h`"
    assert to_telegram_html(text) == "<b>db-1</b> &lt;full&gt; &amp; <code>df -h</code>"
    assert to_slack_mrkdwn(text) == "*db-1* &lt;full&gt; &amp; `df -h`"
    assert plain(text) == "db-1 <full> & df -h"
    assert to_html("one\ntwo\n\n**three**") == "<p>one<br>\ntwo</p>\n<p><b>three</b></p>"


def test_the_telegram_limit_counts_characters_as_the_bot_api_does() -> None:
    # The Bot API counts a text's characters (code points) after entity parsing, so a
    # character outside the BMP is one, where a JavaScript ``length`` counts two units.
    smile = "\U0001F600"
    assert chunk(smile * TELEGRAM_MAX_TEXT, TELEGRAM_MAX_TEXT, to_telegram_html) == [
        smile * TELEGRAM_MAX_TEXT], "8,192 UTF-16 units, 4,096 characters: one message"
    assert [len(c) for c in chunk(smile * (TELEGRAM_MAX_TEXT + 1), TELEGRAM_MAX_TEXT,
                                  to_telegram_html)] == [TELEGRAM_MAX_TEXT, 1]
    # measured on the converted HTML, tags and entities included (never under the count)
    assert [len(c) for c in chunk("&" * TELEGRAM_MAX_TEXT, TELEGRAM_MAX_TEXT,
                                  to_telegram_html)] == [819 * 5] * 5 + [5], "&amp; is five"
