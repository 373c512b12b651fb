"""Console rendering: formatted numbers and times, and charts that escape their labels."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sluice.http.console.render import depth_chart, duration, number, runs_chart, summary, when

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def test_numbers_and_durations() -> None:
    assert number(1234567) == "1,234,567" and number(None) == "—" and number(2.5) == "2.5"
    assert duration(42) == "42 s" and duration(185) == "3 min 5 s"
    assert duration(7440) == "2 h 4 min" and duration(266400) == "3 d 2 h"


def test_times_are_relative_and_absolute_utc() -> None:
    html = str(when("2026-11-30T11:57:00Z", NOW))
    assert 'datetime="2026-11-30T11:57:00.000Z"' in html
    assert "3 min ago" in html and "2026-11-30 11:57:00 UTC" in html
    assert "—" in str(when(None, NOW))


def test_charts_escape_labels_and_plot_every_sample() -> None:
    points = [{"at": (NOW - timedelta(hours=h)).isoformat(), "value": float(h)}
              for h in (1, 2, 3)]
    svg = str(depth_chart(points, start=NOW - timedelta(days=1), end=NOW, label="<q>"))
    assert "&lt;q&gt;" in svg and "<q>" not in svg
    assert svg.count(",") >= 3 and "peak 3" in svg
    empty = str(depth_chart([], start=NOW - timedelta(days=1), end=NOW, label="q"))
    assert "no samples yet" in empty
    runs = str(runs_chart([{"at": NOW.isoformat(), "value": 10.0, "outcome": "error"},
                           {"at": NOW.isoformat(), "value": 5.0, "outcome": "ok"}],
                          start=NOW - timedelta(days=7), end=NOW, label="job"))
    assert 'class="bar bad"' in runs and 'class="bar ok"' in runs and "1 failed" in runs


def test_result_summary() -> None:
    assert summary({"deleted": 1200, "processedAt": "x", "results": []}) == "deleted=1,200"
    assert summary({"error": {"code": "internal_error", "cause": "store_unavailable",
                              "message": "down"}}).startswith("error store_unavailable")


def test_charts_have_axes_units_and_their_window() -> None:
    points = [{"at": (NOW - timedelta(hours=2)).isoformat(), "value": 2.0}]
    day = str(depth_chart(points, start=NOW - timedelta(days=1), end=NOW, label="q"))
    assert day.count('class="axis"') == 2, "a time axis and a value axis"
    assert ">2 items<" in day and ">0<" in day
    assert ">11-29 12:00 UTC<" not in day and ">12:00 UTC<" in day and ">last 24 h<" in day
    week = str(runs_chart([{"at": NOW.isoformat(), "value": 1500.0, "outcome": "ok"}],
                          start=NOW - timedelta(days=7), end=NOW, label="job"))
    assert ">1,500 ms<" in week and ">last 7 d<" in week and ">11-23 12:00 UTC<" in week
