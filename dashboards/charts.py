"""History charts as inline SVG: no script, no external asset, readable offline and in any browser.

Problem: a page per workload shows how each mode's latency moved over the nightly history of every cell,
with detected steps marked. Charting libraries pull scripts or fonts from elsewhere; the site must work
from a file system with no network.

Design: one function turns series of (x, value, tooltip) into an SVG string. Every piece of text that
came from the store goes through ``markupsafe.escape``; the result is returned as ``Markup`` so Jinja
inserts it as is. Points carry ``<title>`` tooltips (run, date, median).

Invariant: the output is a self-contained ``<svg>`` element whose only text is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f")


@dataclass(frozen=True)
class Point:
    x: int  # position in the cell's run history
    value: float
    tooltip: str


@dataclass(frozen=True)
class StepMark:
    x: int
    label: str
    slower: bool


def _nice_ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = min((m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw), default=raw)
    start = math.floor(lo / step) * step
    ticks: list[float] = []
    value = start
    while value <= hi + step * 0.5 and len(ticks) < 12:
        if value >= lo - step * 0.5:
            ticks.append(round(value, 12))
        value += step
    return ticks


def line_chart(
    series: Mapping[str, Sequence[Point]],
    steps: Sequence[StepMark] = (),
    x_labels: Mapping[int, str] | None = None,
    title: str = "",
    unit: str = "ms",
    width: int = 640,
    height: int = 220,
) -> Markup:
    """An SVG line chart: one polyline per named series, dashed verticals at steps."""
    left, right, top, bottom = 56, 120, 22, 28
    points = [p for values in series.values() for p in values]
    if not points:
        what = f" for {escape(title)}" if title else ""
        return Markup(
            f'<svg class="chart" role="img" width="{width}" height="40" viewBox="0 0 {width} 40" '
            f'xmlns="http://www.w3.org/2000/svg"><text x="8" y="24">no data{what}'
            "</text></svg>"
        )
    xs = [p.x for p in points] + [s.x for s in steps]
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = min(p.value for p in points), max(p.value for p in points)
    pad = (y_hi - y_lo) * 0.08 or abs(y_hi) * 0.05 or 1.0
    y_lo, y_hi = max(y_lo - pad, 0.0), y_hi + pad
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x_lo) / ((x_hi - x_lo) or 1) * plot_w

    def sy(y: float) -> float:
        return top + (1 - (y - y_lo) / ((y_hi - y_lo) or 1)) * plot_h

    out = [
        f'<svg class="chart" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fff" stroke="#ccc"/>',
    ]
    for tick in _nice_ticks(y_lo, y_hi):
        y = sy(tick)
        if top - 0.5 <= y <= top + plot_h + 0.5:
            out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
            out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" class="tick">{tick:g}</text>')
    out.append(
        f'<text x="12" y="{top + plot_h / 2:.1f}" transform="rotate(-90 12 {top + plot_h / 2:.1f})" '
        f'text-anchor="middle" class="tick">{escape(unit)}</text>'
    )
    for position, label in (x_labels or {}).items():
        out.append(
            f'<text x="{sx(position):.1f}" y="{height - 8}" text-anchor="middle" class="tick">'
            f"{escape(label)}</text>"
        )
    for step in steps:
        x = sx(step.x - 0.5) if step.x > x_lo else sx(step.x)
        colour = "#d62728" if step.slower else "#2ca02c"
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h}" stroke="{colour}" '
            f'stroke-dasharray="4 3"><title>{escape(step.label)}</title></line>'
        )
    for i, (name, values) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        ordered = sorted(values, key=lambda p: p.x)
        coords = " ".join(f"{sx(p.x):.1f},{sy(p.value):.1f}" for p in ordered)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/>')
        for p in ordered:
            out.append(
                f'<circle cx="{sx(p.x):.1f}" cy="{sy(p.value):.1f}" r="2.2" fill="{colour}">'
                f"<title>{escape(name)}: {escape(p.tooltip)}</title></circle>"
            )
        ly = top + 12 + i * 16
        out.append(
            f'<line x1="{width - right + 10}" x2="{width - right + 26}" y1="{ly - 4}" y2="{ly - 4}" '
            f'stroke="{colour}" stroke-width="2"/>'
            f'<text x="{width - right + 30}" y="{ly}" class="legend">{escape(name)}</text>'
        )
    out.append("</svg>")
    return Markup("".join(out))
