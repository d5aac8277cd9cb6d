"""Broken cells: the judged runs with unexpected failures, one line each, for commands that must fail.

Problem: ``nox -s matrix`` and ``grace-matrix nightly`` run many cells and then must say, after every
cell ran, whether any of them is broken: a result that failed against expected.toml, one that went
missing, a test that failed without recording its result or a run that crashed (the ``tests`` suite,
Note: [Every outcome reaches a verdict] in ``observations``). ``regressions`` exits 1 only for new
regressions (so a nightly fails once per change); a cell that is still broken must still not read as
a success.

Design: ``broken_cells`` reads a ``RegressionReport`` (``report.detect``, so every reader judges with
the same detectors) and returns a frozen ``BrokenCell`` per logical run that has findings in the
thresholds' ``status.fail_on`` set (FAIL and MISSING by default). ``BrokenCell.line`` is the one line a
person reads: cell, run, its status, the counts per verdict and suite, the first failure and the
command that shows the rest; ``since_text`` says since when the cell is broken (the first run of its
streak, ``report.CellReport.failing_since``).

Invariants: read-only (works on a report); FLAKY, XFAIL, IMPROVED and SKIP never make a cell broken;
a cell with a finding in ``fail_on`` is always listed, new or not.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from matrix.readmodel import RunInfo, cell_anchor, cell_key
from matrix.regressions import status
from matrix.regressions.report import RegressionReport
from matrix.store.models import RunStatus
from matrix.text import one_line


@dataclass(frozen=True)
class BrokenCell:
    cell_id: str
    gpu_name: str | None
    run_uid: str
    run_label: str | None
    run_status: RunStatus
    verdicts: tuple[tuple[str, int], ...]  # (verdict, count) of the failing findings
    suites: tuple[tuple[str, int], ...]  # (suite, count) of the failing findings
    new: int  # failing findings not failing in the baseline
    first: str  # the first failing result and what it said
    since: RunInfo | None = None  # the first run of the cell key's streak of broken runs

    @property
    def anchor(self) -> str:
        """The cell's row on the dashboard's index."""
        return cell_anchor(cell_key(self.cell_id, self.gpu_name))

    @property
    def since_text(self) -> str:
        """``failing since <start> (<code>)``, the code being the short sha, else the run's short uid."""
        if self.since is None:
            return ""
        code = self.since.short_sha or f"run {self.since.short_uid}"
        return f"failing since {self.since.started_at:%Y-%m-%d %H:%M} UTC ({code})"

    @property
    def failing(self) -> int:
        return sum(n for _, n in self.verdicts)

    @property
    def where(self) -> str:
        """The command that lists every failure of the cell's run."""
        return f"grace-matrix regressions --run {shlex.quote(self.run_label or self.run_uid)}"

    def line(self) -> str:
        counts = ", ".join(f"{n} {v}" for v, n in self.verdicts)
        by_suite = ", ".join(f"{s} {n}" for s, n in self.suites)
        gpu = f" ({self.gpu_name})" if self.gpu_name else ""
        return (
            f"BROKEN {self.cell_id}{gpu}: run {self.run_uid[:8]} {self.run_status}: {counts} ({by_suite}; "
            f"{self.new} new); first: {self.first}; see: {self.where}"
        )


def _first(finding: status.StatusFinding, limit: int = 160) -> str:
    said = one_line(finding.message, len(finding.message or ""))
    return one_line(
        f"{finding.key.label()} {finding.actual or 'missing'}" + (f": {said}" if said else ""), limit
    )


def broken_cells(report: RegressionReport, fail_on: Iterable[str]) -> list[BrokenCell]:
    """One ``BrokenCell`` per judged logical run with a finding in ``fail_on``, in the report's order."""
    fail_on = tuple(fail_on)
    broken = []
    for cell in report.cells:
        failing = status.failing(cell.findings, fail_on)
        if not failing:
            continue
        new_keys = {r.key for r in cell.regressions if r.new and r.finding is not None}
        verdicts = Counter(f.verdict.value for f in failing)
        suites = Counter(f.key.suite.value for f in failing)
        broken.append(
            BrokenCell(
                cell_id=cell.run.cell_id,
                gpu_name=cell.run.gpu_name,
                run_uid=cell.run.uid,
                run_label=cell.run.label,
                run_status=cell.run.status,
                verdicts=tuple(sorted(verdicts.items())),
                suites=tuple(sorted(suites.items())),
                new=sum(f.key in new_keys for f in failing),
                first=_first(failing[0]),
                since=cell.failing_since,
            )
        )
    return broken
