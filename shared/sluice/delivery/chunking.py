"""Per-platform chunking and format conversion.

A part's text is plain text with two marks, ``**bold**`` and ```code```. Each
platform gets it in its own markup with its own escaping (``to_telegram_html``,
``to_slack_mrkdwn``, ``to_html``), and a text whose converted form is longer than
the platform's limit is split: on paragraph boundaries (blank lines) first, then
lines, then words, and only a single word longer than the limit is cut inside.
Chunks are measured *after* conversion, so escaping (``&`` -> ``&amp;``) can never
push one over the limit. A mark left open at a chunk boundary stays literal text.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator

Convert = Callable[[str], str]

TELEGRAM_MAX_TEXT = 4096
# chat.postMessage truncates text past 40,000 characters and recommends at most 4,000.
SLACK_MAX_TEXT = 4000

_MARKS = re.compile(r"\*\*(?P<bold>[^*\n]+?)\*\*|`(?P<code>[^`\n]+)`")


def _convert(text: str, escape: Convert, bold: tuple[str, str], code: tuple[str, str]) -> str:
    out, at = [], 0
    for match in _MARKS.finditer(text):
        out.append(escape(text[at:match.start()]))
        if match.group("bold") is not None:
            out.append(bold[0] + escape(match.group("bold")) + bold[1])
        else:
            out.append(code[0] + escape(match.group("code")) + code[1])
        at = match.end()
    out.append(escape(text[at:]))
    return "".join(out)


def _html_escape(text: str) -> str:
    return html.escape(text, quote=False)


def to_telegram_html(text: str) -> str:
    """Telegram ``parse_mode=HTML``: ``<``, ``>`` and ``&`` escaped, marks as ``<b>``/``<code>``."""
    return _convert(text, _html_escape, ("<b>", "</b>"), ("<code>", "</code>"))


def slack_escape(text: str) -> str:
    """Slack's three control characters (``&``, ``<``, ``>``) as entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_slack_mrkdwn(text: str) -> str:
    return _convert(text, slack_escape, ("*", "*"), ("`", "`"))


def to_html(text: str) -> str:
    """An email's HTML body: paragraphs as ``<p>``, lines as ``<br>``."""
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "\n".join("<p>" + _convert(p, _html_escape, ("<b>", "</b>"),
                                      ("<code>", "</code>")).replace("\n", "<br>\n") + "</p>"
                     for p in paragraphs)


def plain(text: str) -> str:
    """The marks removed (the text/plain alternative)."""
    return _convert(text, lambda s: s, ("", ""), ("", ""))


_SEPARATORS = ("\n\n", "\n", " ")


def _pieces(text: str, level: int) -> list[str]:
    """``text`` split at ``_SEPARATORS[level]``, each separator kept on the piece before it."""
    sep = _SEPARATORS[level]
    parts = text.split(sep)
    return [p + sep for p in parts[:-1]] + [parts[-1]]


def _cut(word: str, fits: Callable[[str], bool]) -> Iterator[str]:
    """A single over-long word, cut at the longest prefix that fits."""
    while word:
        lo, hi = 1, len(word)
        while lo < hi:  # the longest fitting prefix, by bisection
            mid = (lo + hi + 1) // 2
            if fits(word[:mid]):
                lo = mid
            else:
                hi = mid - 1
        yield word[:lo]
        word = word[lo:]


def _split(text: str, fits: Callable[[str], bool], level: int) -> Iterator[str]:
    if fits(text):
        yield text
        return
    if level == len(_SEPARATORS):
        yield from _cut(text, fits)
        return
    current = ""
    for piece in _pieces(text, level):
        if fits(current + piece):
            current += piece
            continue
        if current:
            yield current
            current = ""
        if fits(piece):
            current = piece
        else:
            yield from _split(piece, fits, level + 1)
    if current:
        yield current


def chunk(text: str, limit: int, convert: Convert = lambda s: s) -> list[str]:
    """``text`` as converted chunks of at most ``limit`` characters each, split on paragraph,
    line, then word boundaries (separators at a boundary are dropped, not sent)."""
    def fits(piece: str) -> bool:
        return len(convert(piece.strip())) <= limit

    chunks = (piece.strip() for piece in _split(text, fits, 0))
    return [convert(piece) for piece in chunks if piece]
