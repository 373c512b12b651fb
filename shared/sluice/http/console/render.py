"""Rendering for the console: the Jinja2 environment (autoescaped), formatting filters and
server-side SVG charts. No markup here is built from unescaped input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from jinja2 import Environment, PackageLoader
from markupsafe import Markup, escape

from sluice.core.times import iso_z

OUTCOME_CLASS = {"ok": "ok", "skipped": "muted", "failures": "bad", "error": "bad",
                 "running": "muted"}


def parse_time(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def duration(seconds: float | None) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 4 min``, ``3 d 2 h``."""
    if seconds is None:
        return "—"
    s = round(abs(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def relative(at: datetime, now: datetime) -> str:
    delta = (now - at).total_seconds()
    if abs(delta) < 1:
        return "just now"
    return f"{duration(delta)} ago" if delta > 0 else f"in {duration(delta)}"


def absolute(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def when(value: Any, now: datetime) -> Markup:
    """A time shown relative and absolute (UTC, seconds); the script keeps the relative part fresh."""
    at = parse_time(value)
    if at is None:
        return Markup('<span class="muted">—</span>')
    iso = iso_z(at)
    return Markup('<time datetime="{}" title="{}"><span class="rel">{}</span> '
                  '<span class="abs">{}</span></time>').format(
        iso, absolute(at), relative(at, now), absolute(at))


def number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"
    return str(value)


def summary(result: Any, limit: int = 120) -> str:
    """A one-line summary of a job result: its scalar keys."""
    if not isinstance(result, dict):
        return "" if result is None else str(result)[:limit]
    if "error" in result and isinstance(result["error"], dict):
        err = result["error"]
        return f"error {err.get('cause') or err.get('code')}: {err.get('message', '')}"[:limit]
    parts = [f"{k}={number(v)}" for k, v in result.items()
             if isinstance(v, int | float | str | bool) and k not in ("processedAt",)]
    text = ", ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- charts ------------------------------------------------------------------------

W, H, PAD = 600, 120, 4


def _scale(value: float, lo: float, hi: float, out_lo: float, out_hi: float) -> float:
    if hi <= lo:
        return (out_lo + out_hi) / 2
    return out_lo + (value - lo) / (hi - lo) * (out_hi - out_lo)


AXIS_BAND = 14  # room under the plot for the time axis labels


def _axes(width: int, height: int, start: datetime, end: datetime, top: str,
          unit: str) -> Markup:
    """Both axes with their labels: the value scale (0 and the top, with the unit) and the
    time window (its start and end, UTC), so a chart reads on its own."""
    bottom = height - AXIS_BAND
    span = end - start
    fmt = "%H:%M" if span <= timedelta(days=1) else "%m-%d %H:%M"
    window = f"{int(span.total_seconds() // 3600)} h" if span < timedelta(days=2) \
        else f"{span.days} d"
    return Markup(
        '<line class="axis" x1="{p}" y1="{b}" x2="{r}" y2="{b}"/>'
        '<line class="axis" x1="{p}" y1="{t}" x2="{p}" y2="{b}"/>'
        '<text x="{lx}" y="{ty}" class="axis-label">{top} {unit}</text>'
        '<text x="{lx}" y="{by}" class="axis-label">0</text>'
        '<text x="{p}" y="{xy}" class="axis-label">{start} UTC</text>'
        '<text x="{mid}" y="{xy}" class="axis-label" text-anchor="middle">last {window}</text>'
        '<text x="{r}" y="{xy}" class="axis-label" text-anchor="end">{end} UTC</text>'
    ).format(p=PAD, r=width - PAD, b=bottom, t=PAD + 14, lx=PAD + 3, ty=PAD + 24,
             by=bottom - 2, xy=height - 2, mid=width // 2, top=top, unit=unit,
             start=start.strftime(fmt), end=end.strftime(fmt), window=window)


def depth_chart(points: list[dict[str, Any]], *, start: datetime, end: datetime,
                label: str, compact: bool = False) -> Markup:
    """Depth over a window: a polyline of the samples, the peak written on the chart."""
    W, H = (300, 56 + AXIS_BAND) if compact else (600, 120 + AXIS_BAND)
    values = [(parse_time(p["at"]), p["value"]) for p in points if p.get("value") is not None]
    samples = [(at, float(v)) for at, v in values if at is not None]
    peak = max((v for _, v in samples), default=0.0)
    t0, t1 = start.timestamp(), end.timestamp()
    top = max(peak, 1.0)
    coords = " ".join(
        f"{_scale(at.timestamp(), t0, t1, PAD, W - PAD):.1f},"
        f"{_scale(v, 0, top, H - AXIS_BAND, PAD + 16):.1f}" for at, v in samples)
    desc = (f"{label}: {len(samples)} samples, peak {number(peak)} items, last "
            f"{number(samples[-1][1]) if samples else '—'}")
    parts = [Markup('<svg class="chart{}" viewBox="0 0 {} {}" role="img" aria-label="{}">'
                    '<title>{}</title>').format(" compact" if compact else "", W, H, desc, desc),
             _axes(W, H, start, end, number(top), "items")]
    if samples:
        if len(samples) == 1:
            x, y = coords.split(",")
            parts.append(Markup('<circle class="line-dot" cx="{}" cy="{}" r="3"/>').format(x, y))
        else:
            parts.append(Markup('<polyline class="line" points="{}"/>').format(coords))
        parts.append(Markup('<text x="{}" y="13" class="chart-label">peak {}</text>').format(
            PAD, number(peak)))
    else:
        parts.append(Markup('<text x="{}" y="{}" class="chart-label" text-anchor="middle">'
                            'no samples yet</text>').format(W // 2, H // 2 + 4))
    parts.append(Markup("</svg>"))
    return Markup("").join(parts)


def runs_chart(points: list[dict[str, Any]], *, start: datetime, end: datetime,
               label: str, compact: bool = False) -> Markup:
    """One bar per run: height is its duration, colour its outcome."""
    W, H = (300, 56 + AXIS_BAND) if compact else (600, 120 + AXIS_BAND)
    parsed = [(parse_time(p["at"]), p.get("value") or 0.0, p.get("outcome") or "")
              for p in points]
    runs = [(at, float(v), str(o)) for at, v, o in parsed if at is not None]
    longest = max((v for _, v, _ in runs), default=0.0)
    t0, t1 = start.timestamp(), end.timestamp()
    bad = sum(1 for _, _, o in runs if OUTCOME_CLASS.get(o) == "bad")
    desc = (f"{label}: {len(runs)} runs, {bad} failed, longest {number(longest)} ms")
    top = max(longest, 1.0)
    parts = [Markup('<svg class="chart{}" viewBox="0 0 {} {}" role="img" aria-label="{}">'
                    '<title>{}</title>').format(" compact" if compact else "", W, H, desc, desc),
             _axes(W, H, start, end, number(top), "ms")]
    base = H - AXIS_BAND
    for at, value, outcome in runs:
        x = _scale(at.timestamp(), t0, t1, PAD, W - PAD - 3)
        y = _scale(value, 0, top, base, PAD + 14)
        top_y = min(y, base - 1)
        parts.append(Markup('<rect class="bar {}" x="{:.1f}" y="{:.1f}" width="4" height="{:.1f}">'
                            '<title>{}: {} ms, {}</title></rect>').format(
            OUTCOME_CLASS.get(outcome, "muted"), x, top_y, base - top_y, absolute(at),
            number(value), outcome))
    if runs:
        parts.append(Markup('<text x="{}" y="13" class="chart-label">longest {} ms</text>').format(
            PAD, number(longest)))
    else:
        parts.append(Markup('<text x="{}" y="{}" class="chart-label" text-anchor="middle">'
                            'no runs yet</text>').format(W // 2, H // 2 + 4))
    parts.append(Markup("</svg>"))
    return Markup("").join(parts)


@cache
def environment() -> Environment:
    env = Environment(loader=PackageLoader("sluice.http.console", "templates"), autoescape=True,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(number=number, duration=duration, summary=summary)
    env.globals.update(when=when, ago=lambda now, seconds: now - timedelta(seconds=seconds), depth_chart=depth_chart, runs_chart=runs_chart,
                       outcome_class=lambda o: OUTCOME_CLASS.get(o, "muted"), escape=escape)
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)
