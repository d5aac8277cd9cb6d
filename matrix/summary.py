"""What the store holds, one line per run: status, stack, outcome counts and record counts.

Problem: after ``nox -s matrix`` a person needs to see at a glance which cells ran, which crashed or
could not be installed, and how many tests passed, before (or without) the dashboards.

Design: ``summarize`` selects runs through the read model (``matrix.readmodel.select_runs``: by uid,
label or cell; by default the newest run of each cell key), counts outcomes and result rows per run
with grouped queries (no row is loaded), and returns frozen ``RunSummary`` values that the CLI prints
as a table or JSON. ``judge`` adds each run's verdict from regression detection
(``matrix.regressions.report.detect``, the same judgement as ``regressions`` and the dashboards: a test
that failed without a result, or a crashed run, is a FAIL) and lists the broken cells
(``matrix.regressions.broken``), so ``summary --check`` can fail a ``nox -s matrix``; ``verdict_block``
is the few lines that close it: the verdict, each broken cell's "failing since" and where to look.

Invariant: read-only, except that stale runs of this host are first marked crashed
(``reap_stale_runs``), so a killed run never shows as still running.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from matrix import readmodel
from matrix.regressions.broken import BrokenCell, broken_cells
from matrix.regressions.errors import RegressionsError
from matrix.regressions.report import CellReport, RegressionReport, detect
from matrix.regressions.status import Expectation
from matrix.regressions.thresholds import Thresholds
from matrix.store.access import reap_stale_runs
from matrix.store.models import (
    CorrectnessResult,
    Diagnostic,
    PerformanceResult,
    PIStageResult,
    RunStatus,
    TestOutcome,
)
from matrix.text import one_line

SHOWN_CELLS = 5  # broken cells named in the closing verdict block; the lines above list every one
OUTCOMES = ("passed", "failed", "skipped", "error", "crashed")
COLUMNS = (
    "cell",
    "status",
    "verdict",
    "torch",
    "triton",
    "gpu",
    *OUTCOMES,
    "records",
    "seconds",
    "label",
    "message",
)
_RECORDS: dict[
    str, type[CorrectnessResult] | type[PerformanceResult] | type[PIStageResult] | type[Diagnostic]
] = {
    "correctness": CorrectnessResult,
    "performance": PerformanceResult,
    "pi_stage": PIStageResult,
    "diagnostic": Diagnostic,
}


@dataclasses.dataclass(frozen=True)
class RunSummary:
    uid: str
    cell_id: str
    kind: str
    status: RunStatus
    label: str | None
    torch: str | None
    triton: str | None
    cuda: str | None
    gpu: str | None
    host: str | None
    started_at: dt.datetime
    duration_s: float | None
    outcomes: dict[str, int]
    records: dict[str, int]
    message: str | None
    verdict: str | None = None  # ok | FAIL <n> | None when not judged (``judge``)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["started_at"] = self.started_at.isoformat()
        return out

    def row(self) -> dict[str, Any]:
        """Flat fields for a text table."""
        return {
            "cell": self.cell_id,
            "status": self.status,
            "torch": self.torch,
            "triton": self.triton,
            "gpu": self.gpu or "cpu",
            **{o: self.outcomes.get(o, 0) for o in OUTCOMES},
            "verdict": self.verdict or "-",
            "records": sum(self.records.values()),
            "seconds": None if self.duration_s is None else round(self.duration_s),
            "label": self.label,
            "message": headline(self.message),
        }


def summarize(
    session: Session,
    uids: Sequence[str] = (),
    labels: Sequence[str] = (),
    cells: Sequence[str] = (),
    latest_only: bool = True,
) -> list[RunSummary]:
    """Runs matching the filters (all given filters apply), newest first; by default the latest per cell
    key (cell id and GPU), as every reader selects them."""
    reap_stale_runs(session)
    pick = readmodel.Pick.NEWEST if latest_only and not uids else readmodel.Pick.EVERY
    selection = readmodel.Selection(tuple(uids), tuple(labels), tuple(cells), pick=pick)
    chosen = readmodel.select_runs(readmodel.load_runs(session), selection)[::-1]  # newest first
    if not chosen:
        return []
    pks = [run.pk for run in chosen]
    outcomes: dict[int, dict[str, int]] = {pk: {} for pk in pks}
    counts = (
        select(TestOutcome.run_pk, TestOutcome.outcome, func.count())
        .where(TestOutcome.run_pk.in_(pks))
        .group_by(TestOutcome.run_pk, TestOutcome.outcome)
    )
    for run_pk, outcome, n in session.execute(counts):
        outcomes[run_pk][outcome] = n
    records: dict[int, dict[str, int]] = {pk: {} for pk in pks}
    for name, model in _RECORDS.items():
        grouped = select(model.run_pk, func.count()).where(model.run_pk.in_(pks)).group_by(model.run_pk)
        for run_pk, n in session.execute(grouped):
            records[run_pk][name] = n
    return [
        RunSummary(
            uid=run.uid,
            cell_id=run.cell_id,
            kind=run.kind,
            status=run.status,
            label=run.label,
            torch=run.torch_version,
            triton=run.triton_version,
            cuda=run.cuda_runtime,
            gpu=run.gpu_name,
            host=run.host,
            started_at=run.started_at,
            duration_s=run.duration_s,
            outcomes=outcomes[run.pk],
            records=records[run.pk],
            message=run.message,
        )
        for run in chosen
    ]


def headline(message: str | None, limit: int = 100) -> str | None:
    """One line of a possibly long message: its first line and its first error line."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    if not lines:
        return None
    errors = [line for line in lines[1:] if line.lower().startswith(("error", "fatal"))]
    text = lines[0] if not errors else f"{lines[0]} {errors[0]}"
    return one_line(text, limit)


def judge(
    session: Session,
    summaries: Sequence[RunSummary],
    thresholds: Thresholds,
    expectations: Sequence[Expectation] | None = None,
    specs: Sequence[str] = (),
) -> tuple[list[RunSummary], list[BrokenCell]]:
    """The summaries with their verdicts, and the broken cells among them, from regression detection
    (``report.detect`` over ``specs``, labels or run uids; default the latest run of every cell): a run
    is judged when it is (a member of) a judged logical run; ``ok`` unless its cell is broken."""
    wanted = {s.uid for s in summaries}
    judged: dict[str, CellReport] = {}
    chosen: list[str | None] = list(specs) or [None]
    for spec in chosen:
        try:
            found = detect(session, thresholds, run_spec=spec, expectations=expectations)
        except RegressionsError:
            continue  # a label or uid with no finished run: nothing to judge
        for cell in found.cells:
            if wanted & set(cell.run.uids):
                judged[cell.run.uid] = cell
    broken = broken_cells(RegressionReport(tuple(judged.values())), thresholds.status.fail_on)
    failing = {b.run_uid: b for b in broken}
    by_member = {uid: cell.run.uid for cell in judged.values() for uid in cell.run.uids}
    out = []
    for summary in summaries:
        owner = by_member.get(summary.uid)
        verdict = None if owner is None else (f"FAIL {failing[owner].failing}" if owner in failing else "ok")
        out.append(dataclasses.replace(summary, verdict=verdict))
    return out, broken


def verdict_block(
    summaries: Sequence[RunSummary], broken: Sequence[BrokenCell], index: str, rendered: bool = True
) -> list[str]:
    """The few closing lines of ``summary --check`` (the end of ``nox -s matrix``): the overall verdict,
    each broken cell with since when it fails and its row on the dashboard (``index``: the index page;
    ``rendered``: whether it exists), and the command that lists every failure."""
    judged = len({(s.cell_id, s.gpu) for s in summaries if s.verdict is not None})
    missing = [] if rendered else [f"({index} is not rendered yet: grace-matrix dashboard renders it)"]
    if not broken:
        return [f"verdict: ok ({judged} cell(s) judged, none broken); the dashboard: {index}", *missing]
    lines = [f"verdict: {len(broken)} broken cell(s) of {judged}"]
    for cell in broken[:SHOWN_CELLS]:
        gpu = cell.gpu_name or "no GPU"
        lines.append(f"  {cell.cell_id} ({gpu}): {cell.since_text or 'failing'}; row: {index}#{cell.anchor}")
    if len(broken) > SHOWN_CELLS:
        lines.append(f"  ... and {len(broken) - SHOWN_CELLS} more (the BROKEN lines above)")
    commands = list(dict.fromkeys(cell.where for cell in broken))
    lines.append(f"every failure, its evidence and repro command: {'; '.join(commands[:2])}")
    return [*lines, *missing]
