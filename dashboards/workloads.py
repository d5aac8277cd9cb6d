"""What a workload's page shows: its latest result per cell and mode, and its history charts per cell.

Problem: a person reading a workload's page every morning must see at a glance, per cell, whether any
mode's latency moved: which steps the history confirms, and whether the latest run jumped in a way that
no step can confirm yet. Cells and modes must be listed in an order a person expects (torch-2.9 before
torch-2.10, modes in the order the suites declare them).

Design: one pass over the history builds workload -> cell key -> mode -> points (x = position in the
cell's window of ``thresholds.history.window`` logical runs). Per mode, ``history.detect_steps`` finds the
steps and ``history.pending_jump`` the unconfirmed jump of the latest run (past ``history.min_step``, the
threshold the step detector applies); ``dashboards.charts.history_chart`` draws one panel per mode with
dated ticks (from the runs' start times). Cells sort by ``natural_key``, modes by
``suites.options.MODE_NAMES`` and then by ``natural_key``.

Invariants: no torch import; only data from the store; strings from the store stay plain strings here
(the chart escapes its text, the templates autoescape the rest).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from markupsafe import Markup

from dashboards.charts import PALETTE, Point, Series, StepMark, Suspect, history_chart
from matrix.readmodel import CellKey, RunInfo
from matrix.regressions import history, pairwise, report
from matrix.regressions.observations import Suite, natural_key
from matrix.regressions.thresholds import Thresholds
from matrix.text import slug
from suites.options import MODE_NAMES

_SPAN_STEPS = 4  # a panel's y range spans at least this many threshold-sized steps (noise at true size)


class LatestRow(NamedTuple):
    """A workload's latest result in one cell and mode, with what the regressions page lists for it."""

    cell: str
    mode: str
    correctness: str
    performance: str
    median: float | None
    regressions: tuple[str, ...] = ()
    regressed_suites: frozenset[str] = frozenset()  # suites whose cell is never shown green


def page_slugs(names: Sequence[str]) -> dict[str, str]:
    """Each workload's page name: its slug, or its hashed slug where the slugs of several names differ
    only in case (one file on a case-insensitive disk: ``mlp`` and ``MLP``); two names with one page
    name are refused (only a 64-bit SHA-1 prefix collision could cause that)."""
    folded: dict[str, list[str]] = defaultdict(list)
    for name in names:
        folded[slug(name).casefold()].append(name)
    pages = {name: slug(name, hashed=len(group) > 1) for group in folded.values() for name in group}
    seen: dict[str, str] = {}
    for name, page in pages.items():
        other = seen.setdefault(page.casefold(), name)
        if other != name:
            raise ValueError(f"workloads {other!r} and {name!r} would share the page {page!r}")
    return pages


def mode_key(mode: str) -> tuple[int, tuple[Any, ...]]:
    """Modes in the order the suites declare them; any other after them, in natural order."""
    return (MODE_NAMES.index(mode) if mode in MODE_NAMES else len(MODE_NAMES), natural_key(mode))


@dataclass(frozen=True)
class HistoryChart:
    cell_key: str
    title: str
    svg: Markup
    steps: tuple[str, ...]
    suspects: tuple[str, ...] = ()  # latest runs that jumped past the step threshold, not yet confirmed


@dataclass(frozen=True)
class WorkloadView:
    name: str
    slug: str
    charts: tuple[HistoryChart, ...]
    latest: tuple[LatestRow, ...]


Histories = dict[str, dict[CellKey, dict[str, list[Point]]]]


def _histories(
    runs: Sequence[RunInfo], medians: dict[int, dict[pairwise.PerfKey, float]], window: int
) -> tuple[Histories, dict[CellKey, list[RunInfo]]]:
    """workload -> cell key -> mode -> points, and each cell key's window of runs (oldest first)."""
    by_cell: dict[CellKey, list[RunInfo]] = defaultdict(list)
    for run in runs:
        by_cell[run.cell_key].append(run)
    histories: Histories = defaultdict(lambda: defaultdict(dict))
    windows: dict[CellKey, list[RunInfo]] = {}
    for key, cell_runs in by_cell.items():
        windows[key] = cell_runs[-window:]
        for x, run in enumerate(windows[key]):
            day = f"{run.started_at:%Y-%m-%d} run {run.short_uid}"
            for (w, mode), value in medians.get(run.pk, {}).items():
                histories[w][key].setdefault(mode, []).append(Point(x, value, f"{day}: {value:.4g} ms"))
    return histories, windows


def _latest(
    reports: Sequence[report.CellReport], medians: dict[int, dict[pairwise.PerfKey, float]]
) -> dict[str, list[LatestRow]]:
    """workload -> (cell, mode, correctness, performance, median, regressions) of the latest run of every
    cell; a result with a regression is never shown green (the regressions page lists the same ones)."""
    latest: dict[str, list[LatestRow]] = defaultdict(list)
    for cell in reports:
        statuses: dict[Suite, dict[pairwise.PerfKey, str]] = {Suite.CORRECTNESS: {}, Suite.PERFORMANCE: {}}
        for f in cell.findings:
            if f.key.suite in statuses:
                statuses[f.key.suite][(f.key.workload, f.key.mode)] = f.actual or "missing"
        run_medians = medians.get(cell.run.pk, {})
        flagged: dict[pairwise.PerfKey, list[tuple[str, str]]] = defaultdict(list)
        for r in cell.regressions:  # the same findings the regressions page lists
            what = (
                r.key.suite.value
                if r.key.suite.value == r.kind.value
                else f"{r.key.suite.value} {r.kind.value}"
            )
            flagged[(r.key.workload, r.key.mode)].append(
                (r.key.suite.value, f"{'NEW' if r.new else 'ongoing'} {what}: {r.summary}")
            )
        for w, mode in set(statuses[Suite.CORRECTNESS]) | set(statuses[Suite.PERFORMANCE]):
            correctness = statuses[Suite.CORRECTNESS].get((w, mode), "-")
            performance = statuses[Suite.PERFORMANCE].get((w, mode), "-")
            flags = flagged.get((w, mode), [])
            latest[w].append(
                LatestRow(
                    cell.run.display_name,
                    mode,
                    correctness,
                    performance,
                    run_medians.get((w, mode)),
                    tuple(text for _, text in flags),
                    frozenset(suite for suite, _ in flags),
                )
            )
    for rows in latest.values():
        rows.sort(key=lambda r: (natural_key(r[0]), mode_key(r[1])))
    return latest


def _series(
    mode: str, points: Sequence[Point], window: Sequence[RunInfo], thresholds: Thresholds
) -> tuple[Series, list[str], list[str]]:
    """One mode's panel, with its steps and its unconfirmed latest jump, and their captions."""
    values = [p.value for p in points]
    found = history.detect_steps(values, thresholds.history)
    marks, notes = [], []
    for step in found:
        when = window[points[step.index].x].started_at
        label = (
            f"{mode}: x{step.ratio:.3f} ({step.before_ms:.4g} -> {step.after_ms:.4g} ms) "
            f"at {when:%Y-%m-%d}, p={step.p_value:.2g}"
        )
        marks.append(StepMark(points[step.index].x, label, step.slower, f"x{step.ratio:.2f}"))
        notes.append(label)
    jump = history.pending_jump(values, found, thresholds.history)
    suspect = Suspect(jump.ratio - 1.0) if jump is not None else None
    suspects = [f"{mode}: {suspect.label}"] if suspect is not None else []
    colour = PALETTE[mode_key(mode)[0] % len(PALETTE)]  # one colour per mode on every page
    return Series(mode, tuple(points), tuple(marks), suspect, colour), notes, suspects


def _chart(
    name: str, key: CellKey, modes: dict[str, list[Point]], window: Sequence[RunInfo], thresholds: Thresholds
) -> HistoryChart:
    panels, notes, suspects = [], [], []
    for mode in sorted(modes, key=mode_key):
        series, step_notes, suspect_notes = _series(mode, modes[mode], window, thresholds)
        panels.append(series)
        notes.extend(step_notes)
        suspects.extend(suspect_notes)
    years = {run.started_at.year for run in window}
    day = "%m-%d" if len(years) == 1 else "%Y-%m-%d"
    labels = {x: f"{run.started_at:{day}}" for x, run in enumerate(window)}
    first, last = window[0].started_at, window[-1].started_at
    span = f"{first:%Y-%m-%d}" if first.date() == last.date() else f"{first:%Y-%m-%d} to {last:%Y-%m-%d}"
    runs = f"{len(window)} run{'s' if len(window) != 1 else ''}"
    title = f"{name} on {key}"
    svg = history_chart(
        panels,
        labels,
        title=title,
        x_title=f"run start date ({runs}, {span})",
        min_span=_SPAN_STEPS * thresholds.history.min_step,
    )
    return HistoryChart(key, title, svg, tuple(notes), tuple(suspects))


def workload_views(
    runs: Sequence[RunInfo],
    medians: dict[int, dict[pairwise.PerfKey, float]],
    reports: Sequence[report.CellReport],
    thresholds: Thresholds,
) -> list[WorkloadView]:
    """Every workload with a result or a history, in natural order, with its cells in natural order."""
    histories, windows = _histories(runs, medians, thresholds.history.window)
    latest = _latest(reports, medians)
    names = sorted(set(histories) | set(latest), key=natural_key)
    pages = page_slugs(names)
    views = []
    for name in names:
        cells = sorted(histories.get(name, {}).items(), key=lambda item: natural_key(item[0]))
        charts = tuple(_chart(name, key, modes, windows[key], thresholds) for key, modes in cells)
        views.append(WorkloadView(name, pages[name], charts, tuple(latest.get(name, ()))))
    return views
