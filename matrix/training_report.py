"""The training view of a report: per training workload, its iteration per mode beside its inference twin.

Problem: a training workload (``<model>_train``) answers "does grace pay for training" only when read
beside the baselines of the same run and beside the inference workload of the same model: its time per
iteration against pt2cg and against the faster of inductor and pt2cg, where its kernels run in graphs
(forward or backward), what its memory costs, and the same model's grace-vs-pt2cg ratio in inference.

Design: ``build_training`` reads a ``matrix.report.Report`` only (the rows ``grace-matrix report`` prints,
so the report and the dashboards show the same figures) and groups its training rows per cell and
workload. ``speedup_vs_best`` compares a mode with the faster of inductor and pt2cg in the same run
(``best_baseline`` names which one). The twin is the inference workload ``matrix.training.inference_twin``
names, in the same cell: of the same tier where the cell has it there, else of another tier (the twin
says which). Per cell, ``geomean_vs_pt2cg`` is the geometric mean of grace's speedup over pt2cg across
the training workloads that have both, and ``twin_geomean_vs_pt2cg`` the same over their distinct twins.
``render_training_text`` formats the view for the terminal; ``TrainingView.to_dict`` is its JSON.

Invariants: read-only and torch-free; figures are never combined across runs, except that the geomeans
combine ratios each taken within one run; a figure not measured is None ("-"), never 0; a mode that
failed shows its status and no figure.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from matrix.report import Report, ReportRow, fmt, speedup
from matrix.statuses import ResultStatus
from matrix.store.models import Workload
from matrix.text import one_line
from matrix.training import PHASES, PhaseFacts, inference_twin, is_training

BASELINES = ("inductor", "pt2cg")  # speedup_vs_best compares with the faster of these (same run)
REFERENCE = "pt2cg"
SUBJECT = "grace"  # the mode the geomeans and the twins' ratios are about
PASSING = (ResultStatus.PASS, ResultStatus.OK)
COLUMNS = (
    "status",
    "median_ms",
    "speedup_vs_pt2cg",
    "speedup_vs_best",
    "kernels_in_graphs",
    *(f"kernels_in_graphs_{phase}" for phase in PHASES),
    "calls_peak_mem",
    "mem_vs_pt2cg",
    "calls_peak_reserved",
    "reserved_vs_pt2cg",
)


@dataclasses.dataclass(frozen=True)
class TrainingMode:
    """One mode of a training workload: ``median_ms`` is the median time of one iteration."""

    mode: str
    status: ResultStatus | None  # the first not passing of correctness and performance, else the verdict
    reason: str | None
    median_ms: float | None
    speedup_vs_pt2cg: float | None
    speedup_vs_best: float | None  # against the faster of inductor and pt2cg in the same run
    best_baseline: str | None  # which of them that was
    kernels_in_graphs: int | None
    phases: tuple[PhaseFacts, ...]
    calls_peak_mem: int | None
    mem_vs_pt2cg: float | None
    calls_peak_reserved: int | None = None
    reserved_vs_pt2cg: float | None = None

    @property
    def failed(self) -> bool:
        return self.status is not None and self.status not in (*PASSING, ResultStatus.SKIP)

    def phase(self, name: str) -> PhaseFacts | None:
        return next((p for p in self.phases if p.phase == name), None)

    def kernels_in_graphs_of(self, name: str) -> int | None:
        facts = self.phase(name)
        return facts.kernels_in_graphs if facts is not None else None

    def value(self, column: str) -> Any:
        """The value of one of ``COLUMNS``."""
        if column.startswith("kernels_in_graphs_"):
            return self.kernels_in_graphs_of(column.removeprefix("kernels_in_graphs_"))
        return getattr(self, column)


@dataclasses.dataclass(frozen=True)
class Twin:
    """The inference workload of the same model in the same cell, and grace's speedup over pt2cg there."""

    workload: str
    tier: str
    run_uid: str
    grace_vs_pt2cg: float | None


@dataclasses.dataclass(frozen=True)
class TrainingWorkload:
    cell: str
    workload: str
    tier: str
    run_uid: str
    modes: tuple[TrainingMode, ...]
    twin: Twin | None

    def mode(self, name: str) -> TrainingMode | None:
        return next((m for m in self.modes if m.mode == name), None)

    @property
    def grace_vs_pt2cg(self) -> float | None:
        subject = self.mode(SUBJECT)
        return subject.speedup_vs_pt2cg if subject is not None else None

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases any mode recorded, in ``PHASES`` order."""
        return tuple(dict.fromkeys(p.phase for m in self.modes for p in m.phases))

    @property
    def twin_text(self) -> str:
        if self.twin is None:
            return "-"
        if self.twin.tier == self.tier:
            return self.twin.workload
        return f"{self.twin.workload} ({self.twin.tier})"


@dataclasses.dataclass(frozen=True)
class TrainingCell:
    cell: str
    workloads: tuple[TrainingWorkload, ...]
    geomean_vs_pt2cg: float | None  # grace over pt2cg, geometric mean over ``geomean_workloads``
    geomean_workloads: int
    twin_geomean_vs_pt2cg: float | None  # the same over the distinct twins that have both
    twin_geomean_workloads: int

    @property
    def headline(self) -> str:
        """One line: grace's geomean speedup over pt2cg in training and in the twins' inference."""
        ours = _geomean_text(self.geomean_vs_pt2cg, self.geomean_workloads, "training workload(s)")
        theirs = _geomean_text(self.twin_geomean_vs_pt2cg, self.twin_geomean_workloads, "inference twin(s)")
        return f"grace vs pt2cg, geomean: {ours}; {theirs}"


@dataclasses.dataclass(frozen=True)
class TrainingView:
    cells: tuple[TrainingCell, ...]

    def of_workload(self, name: str) -> tuple[TrainingWorkload, ...]:
        """The training workload ``name`` in every cell that has it."""
        return tuple(w for c in self.cells for w in c.workloads if w.workload == name)

    def trained_from(self, twin: str) -> tuple[str, ...]:
        """The training workloads whose twin is ``twin`` in some cell, in view order."""
        return tuple(
            dict.fromkeys(
                w.workload for c in self.cells for w in c.workloads if w.twin and w.twin.workload == twin
            )
        )

    def to_dict(self) -> dict[str, Any]:
        return {"columns": list(COLUMNS), "cells": [dataclasses.asdict(c) for c in self.cells]}


def geomean(values: Sequence[float]) -> float | None:
    """The geometric mean of positive ``values``; None for none."""
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _status(row: ReportRow) -> ResultStatus | None:
    if row.status in PASSING and row.perf_status not in (None, ResultStatus.OK):
        return row.perf_status  # correct, but its timing failed or was skipped
    return row.status


def _modes(rows: Sequence[ReportRow]) -> tuple[TrainingMode, ...]:
    medians = {row.mode: row.median_ms for row in rows if row.median_ms is not None}
    timed = [(medians[b], b) for b in BASELINES if b in medians]
    best_ms, best = min(timed) if timed else (None, None)
    return tuple(
        TrainingMode(
            mode=row.mode,
            status=_status(row),
            reason=row.reason,
            median_ms=row.median_ms,
            speedup_vs_pt2cg=row.speedup_vs_pt2cg,
            speedup_vs_best=speedup(best_ms, row.median_ms),
            best_baseline=best,
            kernels_in_graphs=row.kernels_in_graphs,
            phases=row.phases,
            calls_peak_mem=row.calls_peak_mem,
            mem_vs_pt2cg=row.mem_vs_pt2cg,
            calls_peak_reserved=row.calls_peak_reserved,
            reserved_vs_pt2cg=row.reserved_vs_pt2cg,
        )
        for row in rows
    )


def _twin(name: str, tier: str, inference: dict[str, dict[str, list[ReportRow]]]) -> Twin | None:
    """The cell's inference workload of the model, of ``tier`` where it has it there."""
    twin = inference_twin(name)
    tiers = inference.get(twin or "", {})
    if not tiers:
        return None
    rows = tiers[tier] if tier in tiers else tiers[sorted(tiers)[0]]
    subject = next((r for r in rows if r.mode == SUBJECT), None)
    return Twin(
        workload=rows[0].workload,
        tier=rows[0].tier,
        run_uid=rows[0].run_uid,
        grace_vs_pt2cg=subject.speedup_vs_pt2cg if subject is not None else None,
    )


def _cell(cell: str, rows: Sequence[ReportRow]) -> TrainingCell | None:
    grouped: dict[tuple[str, str], list[ReportRow]] = defaultdict(list)
    inference: dict[str, dict[str, list[ReportRow]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row.training:
            grouped[(row.workload, row.tier)].append(row)
        else:
            inference[row.workload][row.tier].append(row)
    if not grouped:
        return None
    workloads = tuple(
        TrainingWorkload(cell, name, tier, group[0].run_uid, _modes(group), _twin(name, tier, inference))
        for (name, tier), group in grouped.items()
    )
    ours = [w.grace_vs_pt2cg for w in workloads if w.grace_vs_pt2cg is not None]
    twins = {(w.twin.workload, w.twin.tier): w.twin.grace_vs_pt2cg for w in workloads if w.twin is not None}
    theirs = [v for v in twins.values() if v is not None]
    return TrainingCell(cell, workloads, geomean(ours), len(ours), geomean(theirs), len(theirs))


def build_training(report: Report) -> TrainingView:
    """The training view of ``report``'s rows (cells and workloads in the report's order)."""
    cells = (_cell(cell, [row for row in report.rows if row.cell == cell]) for cell in report.cells())
    return TrainingView(tuple(c for c in cells if c is not None))


def training_names(session: Session) -> tuple[str, ...]:
    """The workloads a training view reads: those the store tags training, and the twins they name."""
    stored: dict[str, bool] = {}
    for name, tags in session.execute(select(Workload.name, Workload.tags)):  # a row per code hash
        stored[name] = stored.get(name, False) or is_training(tags)
    training = {name for name, trains in stored.items() if trains}
    twins = {twin for name in training if (twin := inference_twin(name)) in stored and twin is not None}
    return tuple(sorted(training | twins))


# -- formatting -----------------------------------------------------------------------------------------


def _geomean_text(value: float | None, count: int, what: str) -> str:
    if value is None:
        return f"no {what} with both grace and pt2cg timed"
    return f"{fmt('speedup', value)} over {count} {what}"


def render_training_text(view: TrainingView) -> str:
    """Aligned text tables, one per cell; "" when the report holds no training workload."""
    out: list[str] = []
    for cell in view.cells:
        out.append(f"training, cell {cell.cell}: {cell.headline}")
        header = ["workload", "tier", "mode", *COLUMNS, "twin", "twin_grace_vs_pt2cg"]
        table = [
            [
                w.workload,
                w.tier,
                m.mode,
                *(fmt(c, m.value(c)) for c in COLUMNS),
                w.twin_text,
                fmt("speedup", w.twin.grace_vs_pt2cg if w.twin else None),
            ]
            for w in cell.workloads
            for m in w.modes
        ]
        widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(header)]
        out.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
        out.extend("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in table)
        failed = [(w, m) for w in cell.workloads for m in w.modes if m.failed]
        if failed:
            out.append("failed:")
            out.extend(f"  {w.workload} / {m.mode}: {m.status}: {one_line(m.reason, 240)}" for w, m in failed)
        out.append("")
    return "\n".join(out)
