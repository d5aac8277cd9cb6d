"""The paper's figures beside one run's: what ``docs/PAPER.md`` and the dashboards' paper page show.

Problem: the paper states a figure (3.36x over PyTorch2-CG on XLNet inference, a 2.21x mean compile
time) and a reader wants ours for the same thing, from one run at one commit, with how many workloads an
aggregate of ours covers and why the two may differ. A figure of ours taken from a mode that failed its
correctness check, or mixed from two runs, would be a wrong figure shown as a measured one.

Design: ``compare`` takes a ``matrix.paper.Paper`` and the ``matrix.report.Report`` of one logical run
(``head_runs`` picks the latest finished logical run of every GPU cell; a caller may pick others) and
measures each metric the paper file defines, per paper workload mapped to ours: the ratio of the two
modes' field in that run, at the workload's largest tier in it. A value counts only when both modes
passed (correctness ``pass``, or performance ``ok`` for a timing reference) and both fields are
positive; otherwise the row says why not (which mode, which status) and carries no value. An aggregate
(mean, geomean, max) is taken over the paper's workloads of that task that we measured, and says how
many of how many. ``FigureRow`` is one stated figure with ours; ``WorkloadRow`` is one paper workload
with ours for every metric and the paper's where stated.

Invariants: read-only; figures of one comparison come from one logical run; a value of ours is never
made up: missing is None with a reason, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from matrix import readmodel
from matrix.compatibility import select_cell_runs
from matrix.paper import Figure, Metric, Paper, PaperWorkload, Scope, Task
from matrix.readmodel import RunInfo
from matrix.report import Report, ReportRow, build_report
from matrix.statuses import ResultStatus

PASSING = (ResultStatus.PASS, ResultStatus.OK)
TIER_ORDER = ("full", "standard", "smoke")  # the largest tier a run has is the closest to the paper's


@dataclass(frozen=True)
class Measured:
    """Ours for one metric: a value, or why there is none; for an aggregate, over how many workloads."""

    value: float | None
    missing: str | None = None
    measured: int = 0  # aggregates: workloads with a value
    listed: int = 0  # aggregates: the paper's workloads of that task that we have


@dataclass(frozen=True)
class FigureRow:
    figure: Figure
    title: str  # the metric's title, or its name when we do not measure it
    ours_name: str | None  # our workload, for a figure of one workload
    ours: Measured
    why: tuple[str, ...]  # what we know of why the two differ


@dataclass(frozen=True)
class WorkloadRow:
    workload: PaperWorkload
    ours: Mapping[str, Measured]  # metric -> ours (every metric the file defines)
    paper: Mapping[str, float]  # metric -> the paper's value, where it states one
    commit: str = ""  # the short sha of the run that recorded our workload ("" when none did or unknown)


@dataclass(frozen=True)
class Comparison:
    paper: Paper
    run: RunInfo | None
    figures: tuple[FigureRow, ...]
    workloads: tuple[WorkloadRow, ...]
    commits: tuple[str, ...] = ()  # the short shas of the runs our figures come from, oldest first

    @property
    def one_commit(self) -> bool:
        return len(self.commits) == 1

    @property
    def stitched(self) -> bool:
        """Whether our figures come from runs at more than one commit (none, or one, is no stitching)."""
        return len(self.commits) > 1

    @property
    def commits_unnamed(self) -> str:
        """What to say for the commits where ``commits`` is empty: no figure of ours, or runs without one."""
        measured = any(m.value is not None for w in self.workloads for m in w.ours.values())
        return "unknown" if measured else "none (no figure of ours comes from this run)"


def head_runs(
    session: Session, uids: Sequence[str] = (), labels: Sequence[str] = (), cells: Sequence[str] = ()
) -> list[RunInfo]:
    """The run each GPU cell's comparison is made with: the latest finished logical run, or every run
    with one of ``uids`` / ``labels`` merged (a run split over several calls); ConfigError (exit 2)
    naming what the store has for a uid, label or cell it does not have."""
    runs = select_cell_runs(readmodel.load_runs(session), uids, labels, cells)
    return [run for run in runs if run.gpu_name]


def compare_run(session: Session, paper: Paper, run: RunInfo) -> Comparison:
    """``paper`` beside the logical run ``run`` of the store behind ``session``."""
    return compare(paper, build_report(session, uids=run.uids), run)


def _tier_rank(tier: str) -> int:
    return TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)


def _rows_by_workload(report: Report) -> dict[str, dict[str, ReportRow]]:
    """workload -> mode -> its row, at the largest tier the report has for the workload."""
    tiers: dict[str, str] = {}
    for row in sorted(report.rows, key=lambda r: _tier_rank(r.tier), reverse=True):
        tiers[row.workload] = row.tier  # the largest tier comes last and wins
    found: dict[str, dict[str, ReportRow]] = {}
    for row in report.rows:
        if tiers[row.workload] == row.tier:
            found.setdefault(row.workload, {})[row.mode] = row
    return found


def _field(rows: Mapping[str, ReportRow], mode: str, field: str) -> tuple[float | None, str | None]:
    row = rows.get(mode)
    if row is None:
        return None, f"{mode} did not run"
    if row.status not in PASSING:
        return None, f"{mode}: {row.status or 'no status'}"
    value = getattr(row, field)
    if value is None:
        return None, f"{mode} has no {field}"
    return float(value), None


def measure(metric: Metric, rows: Mapping[str, ReportRow] | None) -> Measured:
    """``metric`` in one workload's rows (None: the run does not have the workload)."""
    if rows is None:
        return Measured(None, "not in this run")
    numerator, missing = _field(rows, metric.numerator, metric.field)
    if numerator is None:
        return Measured(None, missing)
    if metric.denominator is None:
        return Measured(numerator)
    denominator, missing = _field(rows, metric.denominator, metric.field)
    if denominator is None:
        return Measured(None, missing)
    if numerator <= 0 or denominator <= 0:
        return Measured(None, f"{metric.field} of 0")
    return Measured(numerator / denominator)


def _aggregate(scope: Scope, values: Sequence[float], listed: int) -> Measured:
    if not values:
        return Measured(None, f"none of {listed} workloads measured", 0, listed)
    if scope is Scope.MEAN:
        value = sum(values) / len(values)
    elif scope is Scope.GEOMEAN:
        value = math.exp(sum(math.log(v) for v in values) / len(values))
    else:
        value = max(values)
    return Measured(value, None, len(values), listed)


def _ours_of(
    paper: Paper, by_workload: Mapping[str, Mapping[str, ReportRow]], commits: Mapping[str, str]
) -> list[WorkloadRow]:
    rows = []
    for workload in paper.workloads:
        recorded = by_workload.get(workload.ours or "", {})
        commit = next((commits.get(r.run_uid, "") for r in recorded.values()), "")
        ours = {
            name: measure(metric, by_workload.get(workload.ours))
            if workload.ours
            else Measured(None, "no such workload of ours")
            for name, metric in paper.metrics.items()
        }
        stated = {
            f.metric: f.value
            for f in paper.figures
            if f.scope is Scope.WORKLOAD and (f.task, f.workload) == (workload.task, workload.name)
        }
        rows.append(WorkloadRow(workload, ours, stated, commit))
    return rows


def _figure_row(paper: Paper, figure: Figure, workloads: Sequence[WorkloadRow]) -> FigureRow:
    metric = paper.metrics.get(figure.metric)
    title = metric.title if metric is not None else figure.metric
    why = paper.why(figure.metric, figure.workload)
    if metric is None:
        return FigureRow(figure, title, None, Measured(None, "we do not measure this"), why)
    if figure.scope is Scope.WORKLOAD:
        row = next(
            w for w in workloads if (w.workload.task, w.workload.name) == (figure.task, figure.workload)
        )
        return FigureRow(figure, title, row.workload.ours, row.ours[figure.metric], why)
    mapped = [
        w for w in workloads if w.workload.ours and (figure.task is None or w.workload.task is figure.task)
    ]
    values = [v for w in mapped if (v := w.ours[figure.metric].value) is not None]
    return FigureRow(figure, title, None, _aggregate(figure.scope, values, len(mapped)), why)


def compare(paper: Paper, report: Report, run: RunInfo | None) -> Comparison:
    """``paper``'s figures beside ``report``'s (the report of the one logical run ``run``)."""
    commits = {r.uid: r.short_sha for r in report.runs}
    workloads = _ours_of(paper, _rows_by_workload(report), commits)
    figures = tuple(_figure_row(paper, f, workloads) for f in paper.figures)
    recorded = {w.commit for w in workloads if w.commit}
    used = tuple(dict.fromkeys(r.short_sha for r in report.runs if r.short_sha in recorded))
    return Comparison(paper, run, figures, tuple(workloads), used)


def task_label(task: Task | None) -> str:
    return task.value if task is not None else "both"
