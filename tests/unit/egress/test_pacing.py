"""A peer's pacing answer is parsed strictly and bounded by the cap."""

from __future__ import annotations

import math
from calendar import timegm
from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.egress.pacing import (
    MAX_DIGITS,
    Pacing,
    http_date,
    json_seconds,
    retry_after_header,
    seconds_header,
)

NOW = float(timegm((2026, 1, 5, 9, 0, 0, 0, 0, 0)))  # Mon, 05 Jan 2026 09:00:00 GMT
CAP = 3600.0

NOT_ANSWERS = ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "1e12", "-5", "+5", "2.5",
               "0x10", "٣", "３", "", " ", "5 s", "5,000", "1_000", "soon", "9" * (MAX_DIGITS + 1),
               "9" * 5000, "Mon, 05 Jan 2026 10:00:00 +0000", "Mon, 31 Feb 2026 10:00:00 GMT",
               "Mon, 05 Jan 2026 25:00:00 GMT", "mon, 05 jan 2026 10:00:00 gmt",
               "2026-01-05T10:00:00Z"]


@pytest.mark.parametrize("value", NOT_ANSWERS)
def test_anything_but_digits_or_an_http_date_is_no_answer(value: str) -> None:
    assert retry_after_header(value, cap_s=CAP, now=NOW) is None
    assert seconds_header(value, cap_s=CAP) is None


def test_delta_seconds_are_honoured_up_to_the_cap() -> None:
    assert retry_after_header("120", cap_s=CAP, now=NOW) == Pacing(120.0, CAP)
    assert retry_after_header(" 0\t", cap_s=CAP, now=NOW) == Pacing(0.0, CAP)
    at_cap = retry_after_header("3600", cap_s=CAP, now=NOW)
    assert at_cap is not None and not at_cap.over_cap and at_cap.wait_s == CAP
    huge = retry_after_header("999999999", cap_s=CAP, now=NOW)
    assert huge is not None and huge.over_cap and huge.wait_s == CAP


@pytest.mark.parametrize("value", ["Mon, 05 Jan 2026 10:00:00 GMT",  # IMF-fixdate
                                   "Monday, 05-Jan-26 10:00:00 GMT",  # RFC 850
                                   "Mon Jan  5 10:00:00 2026"])  # asctime
def test_an_http_date_in_each_format_is_the_time_until_it(value: str) -> None:
    assert retry_after_header(value, cap_s=CAP, now=NOW) == Pacing(3600.0, CAP)


def test_a_date_past_is_a_wait_of_zero_and_one_far_ahead_is_over_the_cap() -> None:
    assert retry_after_header("Sun, 04 Jan 2026 10:00:00 GMT", cap_s=CAP,
                              now=NOW) == Pacing(0.0, CAP)
    far = retry_after_header("Fri, 31 Dec 9999 23:59:59 GMT", cap_s=CAP, now=NOW)
    assert far is not None and far.over_cap and far.wait_s == CAP


def test_slack_takes_seconds_only_not_dates() -> None:
    assert seconds_header("12", cap_s=CAP) == Pacing(12.0, CAP)
    assert seconds_header("Mon, 05 Jan 2026 10:00:00 GMT", cap_s=CAP) is None


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e400, 1e12, 2.5, 30.0, -5,
                                   True, False, "30", None, [30], {"s": 30}, 10 ** MAX_DIGITS])
def test_telegram_takes_a_json_integer_only(value: object) -> None:
    assert json_seconds(value, cap_s=CAP) is None


def test_telegram_integers_are_honoured_up_to_the_cap() -> None:
    assert json_seconds(30, cap_s=CAP) == Pacing(30.0, CAP)
    over = json_seconds(999_999_999, cap_s=CAP)
    assert over is not None and over.over_cap and over.wait_s == CAP


@given(st.text(max_size=40))
def test_no_header_text_ever_gives_more_than_the_cap_or_a_non_finite_wait(text: str) -> None:
    for found in (retry_after_header(text, cap_s=CAP, now=NOW), seconds_header(text, cap_s=CAP)):
        if found is not None:
            assert math.isfinite(found.wait_s) and 0 <= found.wait_s <= CAP
            assert found.over_cap == (found.asked_s > CAP)


@given(st.integers(min_value=0, max_value=10 ** MAX_DIGITS - 1),
       st.floats(min_value=1, max_value=86400))
def test_digits_are_read_as_the_number_they_spell_and_capped(n: int, cap: float) -> None:
    found = retry_after_header(str(n), cap_s=cap, now=NOW)
    assert found is not None and found.asked_s == n
    assert found.wait_s == min(n, cap) and found.over_cap == (n > cap)


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
                 st.text(max_size=12), st.integers()))
def test_no_json_value_gives_more_than_the_cap(value: object) -> None:
    found = json_seconds(value, cap_s=CAP)
    if found is not None:
        assert isinstance(value, int) and not isinstance(value, bool) and value >= 0
        assert math.isfinite(found.wait_s) and found.wait_s <= CAP


DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@given(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9999, 12, 31)))
def test_an_imf_fixdate_reads_back_as_the_time_it_names(when: datetime) -> None:
    text = (f"{DAYS[when.weekday()]}, {when.day:02d} {MONTHS[when.month - 1]} {when.year:04d} "
            f"{when:%H:%M:%S} GMT")
    assert http_date(text) == float(timegm(when.timetuple()))
