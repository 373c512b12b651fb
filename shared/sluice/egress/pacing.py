"""What a peer says about when to call it again, parsed strictly and bounded.

Three shapes are answers; everything else is not one (``None``: the caller's own
schedule applies):

- HTTP ``Retry-After`` (``retry_after_header``): delta-seconds, ASCII digits only, or an
  HTTP-date in any of the three formats HTTP allows (IMF-fixdate, RFC 850, asctime),
  always GMT; a date already past is a wait of 0.
- Whole seconds as a header (``seconds_header``: Slack's ``Retry-After``): digits only.
- Whole seconds as a JSON number (``json_seconds``: Telegram's
  ``parameters.retry_after``): an integer, not a bool, not a float.

So ``nan``, ``inf``, ``1e400``, ``1e12``, ``-5``, ``2.5``, ``+3``, ``٣`` (a non-ASCII
digit), an empty value, and more than ``MAX_DIGITS`` digits are no answer. An answer
is honoured up to ``cap_s`` (``SLUICE_DELIVERY_PACING_CAP_SECONDS``, an hour by default):
one that asks for longer is ``over_cap``, which the caller treats as the destination
failing (its probe schedule) rather than as a wait, so no single answer holds a key that
other tenants share for longer than the cap.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import NamedTuple

# Ten digits is over three centuries: a longer number is noise, not a wait.
MAX_DIGITS = 10
DEFAULT_CAP_S = 3600

_DIGITS = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}")
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_WEEKDAY = r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)"
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTH = "(?P<month>" + "|".join(_MONTHS) + ")"
_TIME = r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})"
# RFC 9110 section 5.6.7: the preferred format, then the two obsolete ones it still requires
_DATES = (
    re.compile(rf"{_DAY}, (?P<day>[0-9]{{2}}) {_MONTH} (?P<year>[0-9]{{4}}) {_TIME} GMT"),
    re.compile(rf"{_WEEKDAY}, (?P<day>[0-9]{{2}})-{_MONTH}-(?P<yy>[0-9]{{2}}) {_TIME} GMT"),
    re.compile(rf"{_DAY} {_MONTH} (?P<day>[ 0-9][0-9]) {_TIME} (?P<year>[0-9]{{4}})"),
)


class Pacing(NamedTuple):
    """A peer's wait, parsed: what it asked (finite, at least 0) and the cap it is held to."""

    asked_s: float
    cap_s: float

    @property
    def over_cap(self) -> bool:
        """It asked for longer than the cap: not honoured as a wait."""
        return self.asked_s > self.cap_s

    @property
    def wait_s(self) -> float:
        """What is honoured: the answer, never more than the cap."""
        return min(self.asked_s, self.cap_s)


def _bounded(asked: float, cap_s: float) -> Pacing:
    return Pacing(float(asked), float(cap_s))


def _ows(value: str) -> str:
    return value.strip(" \t")  # a header's optional whitespace, and nothing else


def seconds_header(value: str | None, *, cap_s: float = DEFAULT_CAP_S) -> Pacing | None:
    """Whole seconds in a header: ASCII digits only (at most ``MAX_DIGITS``)."""
    if value is None:
        return None
    text = _ows(value)
    if not _DIGITS.fullmatch(text):
        return None
    return _bounded(int(text), cap_s)


def json_seconds(value: object, *, cap_s: float = DEFAULT_CAP_S) -> Pacing | None:
    """Whole seconds as a JSON integer (not a bool, a float or a string), at least 0."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    if value < 0 or value >= 10 ** MAX_DIGITS:
        return None
    return _bounded(value, cap_s)


def http_date(value: str) -> float | None:
    """An HTTP-date as a Unix time, or None when it is not one (a day that does not exist
    included)."""
    for pattern in _DATES:
        match = pattern.fullmatch(value)
        if match is None:
            continue
        found = match.groupdict()
        if found.get("yy") is not None:  # RFC 850: never more than 50 years ahead
            this = time.gmtime().tm_year
            year = this - this % 100 + int(found["yy"])
            year = year - 100 if year > this + 50 else year
        else:
            year = int(found["year"])
        try:  # a real calendar day and time (no 31 Feb, no 25:00)
            when = datetime(year, _MONTHS.index(found["month"]) + 1, int(found["day"]),
                            int(found["hour"]), int(found["minute"]), int(found["second"]),
                            tzinfo=UTC)
        except ValueError:
            return None
        return when.timestamp()
    return None


def retry_after_header(value: str | None, *, cap_s: float = DEFAULT_CAP_S,
                       now: float | None = None) -> Pacing | None:
    """HTTP ``Retry-After``: delta-seconds or an HTTP-date (``now``: Unix time, for dates)."""
    if value is None:
        return None
    text = _ows(value)
    found = seconds_header(text, cap_s=cap_s)
    if found is not None:
        return found
    at = http_date(text)
    if at is None:
        return None
    return _bounded(max(0.0, at - (time.time() if now is None else now)), cap_s)


__all__ = ["DEFAULT_CAP_S", "MAX_DIGITS", "Pacing", "http_date", "json_seconds",
           "retry_after_header", "seconds_header"]
