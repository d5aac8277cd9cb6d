"""History charts as inline SVG small multiples: no script, no external asset, readable offline.

Problem: a page per workload shows how each mode's median latency moved over the nightly history of a
cell, with detected steps marked. Four to seven modes drawn as lines in one box overlap (their levels
differ several-fold, so the interesting ones are flattened), a legend of fixed width clips long names,
and charting libraries pull scripts or fonts from elsewhere while the site must work from a file system.

Design: ``history_chart`` stacks one small panel per series (mode) in one ``<svg>``. Every panel has its
own y scale (ticks and the axis title, such as "median ms"; at least ``min_span`` x the series' median
wide, so run-to-run noise is drawn at its true size), a header naming the series in full, and the latest
value at its right; all panels share one x axis (positions in the cell's run history) whose
evenly spaced, dated ticks sit under the last panel and whose grid lines run through every panel. Text is
measured by its length in characters (``CHAR_EM``, a generous average glyph width), and the layout grows
around it: margins widen for long tick or value labels, and a series name longer than its row wraps onto
more lines instead of being cut. Steps are dashed verticals in their series' panel; a suspect latest
point (a jump the step detector cannot confirm yet) gets a hollow ring. A history of one run draws every
series as one marked point, centred, with its value written above it.

Invariant: the output is a self-contained ``<svg>`` element; every piece of text that came from the store
goes through ``markupsafe.escape`` exactly once (wrapping splits the raw text, then escapes each line),
and the result is returned as ``Markup`` so Jinja inserts it as is.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

PALETTE = ("#1f77b4", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
"""Series colours; red and green are left to the marks (slower, faster)."""
SLOWER, FASTER = "#d62728", "#2ca02c"
CHAR_EM = 0.62  # average glyph width of a sans-serif font in ems, rounded up: over-estimating never clips
TICK_FONT, LABEL_FONT = 10, 11  # px, as dashboards/static/style.css sets them for svg.chart
MAX_X_TICKS = 8
_BREAK_AFTER = re.compile(r"(?<=[-_/.:@ ])")


@dataclass(frozen=True)
class Point:
    x: int  # position in the cell's run history
    value: float
    tooltip: str


@dataclass(frozen=True)
class StepMark:
    x: int  # position of the first point after the step
    label: str  # the tooltip: ratio, medians, date, p-value
    slower: bool
    tag: str = ""  # short text drawn beside the mark, such as "x1.13"


@dataclass(frozen=True)
class Suspect:
    """The latest point jumped past the step threshold, but too few runs follow it to confirm a step."""

    change: float  # last / previous median - 1

    @property
    def label(self) -> str:
        return f"last run: {self.change * 100:+.1f}% vs previous median, not yet confirmed as a step"


@dataclass(frozen=True)
class Series:
    name: str
    points: tuple[Point, ...]  # in run order
    steps: tuple[StepMark, ...] = ()
    suspect: Suspect | None = None
    colour: str = ""  # "" takes the palette's colour for the series' position


@dataclass(frozen=True)
class _Panel:
    series: Series
    colour: str
    name_lines: tuple[str, ...]
    top: float  # y of the header's first baseline
    plot_top: float
    lo: float
    hi: float
    ticks: tuple[float, ...]


def text_width(text: str, size: float) -> float:
    """A generous estimate of the rendered width of ``text`` at font size ``size`` (px)."""
    return len(text) * size * CHAR_EM


def wrap(text: str, size: float, room: float) -> list[str]:
    """``text`` in lines no wider than ``room`` (by ``text_width``), broken after separators where possible,
    else inside a word; joined, the lines give ``text`` back."""
    per_line = max(1, int(room // (size * CHAR_EM)))
    lines: list[str] = []
    line = ""
    for piece in _BREAK_AFTER.split(text):
        if len(line) + len(piece) <= per_line:
            line += piece
            continue
        if line:
            lines.append(line)
        while len(piece) > per_line:
            lines.append(piece[:per_line])
            piece = piece[per_line:]
        line = piece
    if line or not lines:
        lines.append(line)
    return lines


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


def _y_domain(values: Sequence[float], min_span: float) -> tuple[float, float, tuple[float, ...]]:
    """The panel's value range: the values padded, at least ``min_span`` x their median wide (centred on
    them), so that run-to-run noise is drawn at its true size instead of filling the panel."""
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.12 or abs(hi) * 0.05 or 1.0
    lo, hi = lo - pad, hi + pad
    wanted = min_span * statistics.median(values)
    if hi - lo < wanted:
        middle = (lo + hi) / 2
        lo, hi = middle - wanted / 2, middle + wanted / 2
    lo = max(lo, 0.0)
    for count in (3, 4, 6):  # at least two labelled ticks where a finer step gives them
        ticks = tuple(t for t in _nice_ticks(lo, hi, count) if lo <= t <= hi)
        if len(ticks) >= 2:
            break
    return lo, hi, ticks


def x_ticks(positions: Sequence[int], labels: Mapping[int, str], room: float) -> list[int]:
    """Evenly spaced positions (first and last included) whose labels fit side by side in ``room`` px;
    a position whose label repeats the one before (two runs on one day) is left out."""
    if not positions:
        return []
    widest = max((text_width(labels.get(p, ""), TICK_FONT) for p in positions), default=0.0)
    fit = max(1, int(room // (widest + 12)))
    count = min(len(positions), fit, MAX_X_TICKS)
    if count == 1:
        return [positions[len(positions) // 2]] if len(positions) > 1 and fit == 1 else [positions[0]]
    picked: list[int] = []
    for i in range(count):
        position = positions[round(i * (len(positions) - 1) / (count - 1))]
        if not picked or labels.get(position) != labels.get(picked[-1]):
            picked.append(position)
    return picked


def _no_data(title: str, width: int) -> Markup:
    what = f" for {escape(title)}" if title else ""
    return Markup(
        f'<svg class="chart" role="img" width="{width}" height="40" viewBox="0 0 {width} 40" '
        f'xmlns="http://www.w3.org/2000/svg"><text x="8" y="24">no data{what}</text></svg>'
    )


@dataclass(frozen=True)
class _Frame:
    """What every panel shares: the plot area's left edge, size and the x scale."""

    left: float
    plot_w: float
    plot_h: float
    x_lo: int
    x_hi: int
    unit: str
    axis_title: str
    grid: tuple[int, ...]  # x positions of the dated ticks

    @property
    def single(self) -> bool:
        return self.x_lo == self.x_hi

    def sx(self, x: float) -> float:
        if self.single:
            return self.left + self.plot_w / 2
        return self.left + (x - self.x_lo) / (self.x_hi - self.x_lo) * self.plot_w


def history_chart(
    series: Sequence[Series],
    x_labels: Mapping[int, str] | None = None,
    title: str = "",
    unit: str = "ms",
    axis_title: str = "median ms",
    x_title: str = "",
    width: int = 640,
    min_span: float = 0.0,
) -> Markup:
    """Small multiples: one panel per series with a non-empty history, in the order given; each panel's
    y range is at least ``min_span`` x the series' median wide."""
    shown = [s for s in series if s.points]
    if not shown:
        return _no_data(title, width)
    labels = dict(x_labels or {})
    positions = sorted({p.x for s in shown for p in s.points} | set(labels))
    domains = [_y_domain([p.value for p in s.points], min_span) for s in shown]
    tick_w = max((text_width(f"{t:g}", TICK_FONT) for _, _, ticks in domains for t in ticks), default=0.0)
    left = max(48.0, 20 + tick_w + 8)
    ends = [f"{s.points[-1].value:.4g} {unit}" for s in shown]
    right = 12.0 if len(positions) == 1 else max(text_width(e, TICK_FONT) for e in ends) + 16
    plot_w, plot_h = width - left - right, max(48.0, text_width(axis_title, TICK_FONT) + 6)
    grid = tuple(x_ticks(positions, labels, plot_w))
    frame = _Frame(left, plot_w, plot_h, positions[0], positions[-1], unit, axis_title, grid)
    panels, y = [], 4.0
    for i, (s, (lo, hi, ticks)) in enumerate(zip(shown, domains, strict=True)):
        lines = tuple(wrap(s.name, LABEL_FONT, width - left - 22))
        top = y + LABEL_FONT + 2
        plot_top = top + (len(lines) - 1) * (LABEL_FONT + 3) + 6
        panels.append(_Panel(s, s.colour or PALETTE[i % len(PALETTE)], lines, top, plot_top, lo, hi, ticks))
        y = plot_top + plot_h + 8
    height = y + TICK_FONT + 8 + (TICK_FONT + 6 if x_title else 0)
    out = [
        f'<svg class="chart" role="img" width="{width}" height="{height:.0f}" viewBox="0 0 {width} '
        f'{height:.0f}" xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
    ]
    for panel in panels:
        out.extend(_panel_frame(panel, frame))
        out.extend(_panel_data(panel, frame))
    bottom = panels[-1].plot_top + plot_h
    for position in grid:
        out.append(
            f'<text x="{frame.sx(position):.1f}" y="{bottom + TICK_FONT + 4:.1f}" text-anchor="middle" '
            f'class="xtick">{escape(labels.get(position, ""))}</text>'
        )
    if x_title:
        out.append(
            f'<text x="{left + plot_w / 2:.1f}" y="{height - 4:.1f}" text-anchor="middle" class="tick">'
            f"{escape(x_title)}</text>"
        )
    out.append("</svg>")
    return Markup("".join(out))


def _sy(panel: _Panel, frame: _Frame, value: float) -> float:
    span = (panel.hi - panel.lo) or 1.0
    return panel.plot_top + (1 - (value - panel.lo) / span) * frame.plot_h


def _panel_frame(panel: _Panel, frame: _Frame) -> list[str]:
    """A panel's header (the series' name, wrapped), box, grid, y ticks and y axis title; opens its <g>."""
    left, top, plot_top, plot_h = frame.left, panel.top, panel.plot_top, frame.plot_h
    bottom = plot_top + plot_h
    name = "".join(
        f'<tspan x="{left + 18:.1f}" dy="{0 if i == 0 else LABEL_FONT + 3}">{escape(line)}</tspan>'
        for i, line in enumerate(panel.name_lines)
    )
    out = [
        f'<g class="panel"><line x1="{left:.1f}" x2="{left + 14:.1f}" y1="{top - 4:.1f}" y2="{top - 4:.1f}" '
        f'stroke="{panel.colour}" stroke-width="2.5"/>'
        f'<text x="{left + 18:.1f}" y="{top:.1f}" class="legend">{name}</text>',
        f'<rect x="{left:.1f}" y="{plot_top:.1f}" width="{frame.plot_w:.1f}" height="{plot_h:.1f}" '
        'fill="#fff" stroke="#ccc"/>',
    ]
    for position in frame.grid:
        x = frame.sx(position)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{plot_top:.1f}" y2="{bottom:.1f}" stroke="#eee"/>')
    for tick in panel.ticks:
        y = _sy(panel, frame, tick)
        out.append(
            f'<line x1="{left:.1f}" x2="{left + frame.plot_w:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{left - 4:.1f}" y="{y + 3.5:.1f}" text-anchor="end" class="tick">{tick:g}</text>'
        )
    mid = plot_top + plot_h / 2
    out.append(
        f'<text x="12" y="{mid:.1f}" transform="rotate(-90 12 {mid:.1f})" text-anchor="middle" '
        f'class="tick">{escape(frame.axis_title)}</text>'
    )
    return out


def _panel_data(panel: _Panel, frame: _Frame) -> list[str]:
    """A panel's steps, line, points, latest value and suspect ring; closes its <g>."""
    s, colour, plot_top, sx = panel.series, panel.colour, panel.plot_top, frame.sx
    out = []
    for step in s.steps:
        x = max(sx(step.x - 0.5), frame.left)
        stroke = SLOWER if step.slower else FASTER
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{plot_top:.1f}" y2="{plot_top + frame.plot_h:.1f}" '
            f'stroke="{stroke}" stroke-dasharray="4 3"><title>{escape(step.label)}</title></line>'
        )
        if step.tag:
            out.append(
                f'<text x="{x + 3:.1f}" y="{plot_top + TICK_FONT:.1f}" class="tick">{escape(step.tag)}</text>'
            )
    if len(s.points) > 1:
        coords = " ".join(f"{sx(p.x):.1f},{_sy(panel, frame, p.value):.1f}" for p in s.points)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/>')
    radius = 3.5 if frame.single else 2.2
    for p in s.points:
        out.append(
            f'<circle cx="{sx(p.x):.1f}" cy="{_sy(panel, frame, p.value):.1f}" r="{radius}" fill="{colour}">'
            f"<title>{escape(s.name)}: {escape(p.tooltip)}</title></circle>"
        )
    last = s.points[-1]
    cx, cy = sx(last.x), _sy(panel, frame, last.value)
    value = f"{last.value:.4g} {escape(frame.unit)}"
    if frame.single:  # centred above the point
        out.append(f'<text x="{cx:.1f}" y="{cy - 7:.1f}" text-anchor="middle" class="value">{value}</text>')
    else:  # right of the panel, level with the latest point
        x = frame.left + frame.plot_w + 9  # clear of a suspect ring (r 6)
        out.append(f'<text x="{x:.1f}" y="{cy + 3.5:.1f}" class="value">{value}</text>')
    if s.suspect is not None:
        stroke = SLOWER if s.suspect.change > 0 else FASTER
        out.append(
            f'<circle class="suspect" cx="{cx:.1f}" cy="{cy:.1f}" r="6" fill="none" stroke="{stroke}" '
            f'stroke-width="1.8"><title>{escape(s.name)}: {escape(s.suspect.label)}</title></circle>'
        )
    out.append("</g>")
    return out
