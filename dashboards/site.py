"""What the dashboards show, computed from the results store alone (the view model of the site).

Problem: every page needs a different cut of the same store (latest run per cell, the regressions with
their evidence, PI stages per Triton x torch x CUDA, which parts of GraCE work per cell, each workload's
history, any two runs side by side), and the site must build in seconds from a store holding 100k results.

Design: ``build_site`` reads the store once per table with column selects (``matrix.regressions.loader``
and a compact raw pass for the per-run comparison data), runs regression detection on the latest run of
every cell (``matrix.regressions.report.detect``), builds each workload's page with its history charts
(``dashboards.workloads``), builds the compatibility table (``matrix.compatibility.build_table``, as
docs/COMPATIBILITY.md does) and returns frozen view objects. ``dashboards.render`` turns them into
files; nothing here writes. A cell broken against expected.toml says since when
(``report.CellReport.failing_since``, computed on the matrix side; the grid row adds the run before it, so
the index can link the change that broke it). Training workloads and their inference twins come from the
training view of ``grace-matrix report`` (``matrix.training_report``), the figures that command prints.
Every run shown is a logical run selected by the read model (``matrix.readmodel.select_runs``): the runs of
one cell sharing a label are one row of the grid, one point of a history, one side of a comparison, with, per
key, the results of the latest of them that recorded it.

Invariants: no torch import; only data from the store; every string from a test stays a plain string here
(escaping is the templates' job, with autoescape on).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboards.fuzz import FuzzRow, fuzz_rows
from dashboards.workloads import HistoryChart, WorkloadView, slug, workload_views
from matrix import readmodel
from matrix.compatibility import CompatibilityTable, build_table
from matrix.paper import Paper
from matrix.paper_compare import Comparison, compare_run, head_runs
from matrix.readmodel import RunInfo
from matrix.regressions import loader, logical, pairwise, report, status
from matrix.regressions.observations import (
    PASSING_STATUS,
    RUN_SUBJECT,
    SKIP_STATUS,
    TEST_FAILURES,
    Suite,
    natural_key,
)
from matrix.regressions.status import Verdict
from matrix.regressions.thresholds import Thresholds
from matrix.report import build_report
from matrix.statuses import ResultStatus, read_status, row_status
from matrix.store.models import Cell, CorrectnessResult, PerformanceResult, PIStageResult, Workload
from matrix.training_report import TrainingView, build_training, training_names
from suites.records import PIStage

__all__ = ["HistoryChart", "Site", "WorkloadView", "build_site", "slug"]

HEADLINES = (("grace", "inductor"), ("grace", "pt2cg"), ("pt2cg", "inductor"))
"""Speedups shown on the index: (mode, reference), geometric mean over workloads that ran in both."""
PI_STAGES = tuple(s.value for s in PIStage)
SUITES = (Suite.CORRECTNESS, Suite.PERFORMANCE, Suite.PI)
_BAD = {Verdict.FAIL, Verdict.MISSING}
_WARN = {Verdict.XFAIL, Verdict.FLAKY, Verdict.IMPROVED}  # a SKIP is neutral: it says what did not apply


@dataclass(frozen=True)
class SuiteSummary:
    suite: str
    counts: dict[str, int]
    state: str  # ok | warn | bad | none
    regressed: int = 0  # regressions of this suite in the run (status, pairwise and history)
    broken_tests: int = 0  # the tests suite's failures blamed on this suite (``_blame``)

    @property
    def text(self) -> str:
        if not self.counts and not self.broken_tests:
            return "-"
        order = [v.value for v in Verdict]
        text = ", ".join(f"{self.counts[k]} {k}" for k in order if self.counts.get(k))
        if self.broken_tests:
            text = f"{text}; " if text else ""
            text += f"{self.broken_tests} test(s) failed without a result"
        return f"{text}; {self.regressed} regressed" if self.regressed else text


@dataclass(frozen=True)
class Speedup:
    mode: str
    reference: str
    value: float | None
    workloads: int


@dataclass(frozen=True)
class GridRow:
    run: RunInfo
    baseline: RunInfo | None
    suites: tuple[SuiteSummary, ...]
    outcomes: dict[str, int]
    speedups: tuple[Speedup, ...]
    new_regressions: int
    regressions: int
    synthetic: bool
    tests: SuiteSummary | None = None  # the tests suite: failures no result explains, the run's end
    failing_since: RunInfo | None = None  # broken against expected.toml: the first run of the streak
    before_failing: RunInfo | None = None  # the run of the cell key just before that streak, if any

    @property
    def broken(self) -> bool:
        return self.outcomes_state == "bad" or any(s.state == "bad" for s in self.suites)

    @property
    def anchor(self) -> str:
        return self.run.anchor

    @property
    def outcomes_state(self) -> str:
        """The pytest column's colour: the tests suite's verdicts where it has any; else warn for failed
        tests whose own records carry their verdicts; else ok where a test passed, or none (only skips,
        or no outcomes: neutral, as a suite's column with only skips)."""
        if self.tests is not None and self.tests.counts:
            return self.tests.state
        if any(self.outcomes.get(o) for o in TEST_FAILURES):
            return "warn"
        return "ok" if self.outcomes.get(ResultStatus.PASSED.value) else "none"


@dataclass(frozen=True)
class RegressionView:
    anchor: str
    regression: report.Regression
    run: RunInfo
    baseline: RunInfo | None
    workload_page: str | None


@dataclass(frozen=True)
class PIFailure:
    cell_id: str
    run_uid: str
    subject: str
    stage: str
    status: str
    message: str
    nodeid: str


@dataclass(frozen=True)
class PIStackRow:
    gpu: str
    triton: str
    torch: str
    cuda: str
    cells: tuple[str, ...]
    stages: dict[str, dict[str, int]]  # stage -> status -> count
    failures: tuple[PIFailure, ...]
    broken_tests: int = 0  # PI tests that failed without a result (Note: [Every outcome reaches a verdict])

    def state(self, stage: str) -> str:
        counts = self.stages.get(stage, {})
        if not counts:
            return "none"
        if counts.get("fail") or self.broken_tests:  # a stage is not shown passing beside a dead test
            return "bad"
        return "ok" if counts.get("pass") else "warn"


@dataclass(frozen=True)
class RunDigest:
    """Per-run data for the side-by-side comparison (written as a small script file per run)."""

    run: RunInfo
    rows: list[list[Any]]  # [suite, workload, mode, status, median_ms or None]
    counts: dict[str, int]


@dataclass(frozen=True)
class Site:
    generated_at: dt.datetime
    runs: tuple[RunInfo, ...]
    grid: tuple[GridRow, ...]
    regressions: tuple[RegressionView, ...]
    improvements: tuple[tuple[RunInfo, str], ...]
    pi_rows: tuple[PIStackRow, ...]
    workloads: tuple[WorkloadView, ...]
    digests: tuple[RunDigest, ...]
    pairs: tuple[tuple[RunInfo, RunInfo, pairwise.PairwiseReport | None], ...]  # (baseline, run) per cell
    synthetic: bool
    result_count: int
    thresholds: Thresholds
    compatibility: CompatibilityTable  # per cell, which parts of GraCE work (matrix.compatibility)
    extra: dict[str, Any] = field(default_factory=dict)
    fuzz: tuple[FuzzRow, ...] = ()  # the differential fuzzer's runs, newest first (dashboards.fuzz)
    training: TrainingView = field(default_factory=lambda: TrainingView(()))  # as ``report`` shows it
    paper: Paper | None = None  # the paper's figures (matrix/paper.toml), when the site was given them
    paper_runs: tuple[Comparison, ...] = ()  # beside each GPU cell's head run (docs/PAPER.md's tables)

    def workload_page(self, name: str) -> str | None:
        """The slug of ``name``'s workload page; None when the site has no page for it."""
        return next((w.slug for w in self.workloads if w.name == name), None)

    # -- the index's verdict header ---------------------------------------------------------------
    @property
    def new_regressions(self) -> int:
        """As the regressions page counts them (one list for both)."""
        return len(self.new_regression_views)

    @property
    def new_regression_views(self) -> tuple[RegressionView, ...]:
        return tuple(view for view in self.regressions if view.regression.new)

    @property
    def pi_breakages(self) -> int:
        return sum(len(row.failures) for row in self.pi_rows)

    @property
    def pi_failures(self) -> tuple[PIFailure, ...]:
        return tuple(f for row in self.pi_rows for f in row.failures)

    @property
    def broken_rows(self) -> tuple[GridRow, ...]:
        """Cells whose latest run has a failure in some part (the red rows of the grid)."""
        return tuple(row for row in self.grid if row.broken)


def _state(verdicts: Counter[str], failing: bool) -> str:
    if failing or any(verdicts.get(v.value) for v in _BAD):
        return "bad"
    if any(verdicts.get(v.value) for v in _WARN):
        return "warn"
    if verdicts.get(Verdict.PASS.value):
        return "ok"
    return "none"  # nothing judged, or only skips


def _synthetic_cells(session: Session) -> set[str]:
    rows = session.execute(select(Cell.cell_id, Cell.gpu_name, Cell.extra))
    return {
        f"{cid}@{gpu or 'no-gpu'}"
        for cid, gpu, extra in rows
        if isinstance(extra, dict) and extra.get("synthetic")
    }


def _digests(session: Session, runs: Sequence[RunInfo]) -> tuple[list[RunDigest], int]:
    """One compact pass over every result row: per-run comparison rows and status counts (of each logical
    run, merged by ``readmodel.merge_latest``). A row is judged here by its status and the median it shows
    (an unreadable median counts ``unreadable``, with no figure); its JSON columns are not decoded for
    every run of the history (the verdicts, which read whole rows, judge the runs they judge)."""
    rows: dict[int, list[list[Any]]] = defaultdict(list)
    total = 0
    for model, suite in ((CorrectnessResult, "correctness"), (PerformanceResult, "performance")):
        columns = [model.run_pk, Workload.name, model.mode, model.status]
        if model is PerformanceResult:
            columns.append(PerformanceResult.median_ms)
        stmt = select(*columns).join(Workload, model.workload_pk == Workload.id).order_by(model.id)
        for row in session.execute(stmt):
            median = row[4] if len(row) > 4 else None
            run_pk, status = cast(int, row[0]), row_status(cast(str, row[3]), median)
            figure = None if status is ResultStatus.UNREADABLE else median
            rows[run_pk].append([suite, row[1], row[2], status, figure])
            total += 1
    stmt_pi = select(
        PIStageResult.run_pk, PIStageResult.subject, PIStageResult.stage, PIStageResult.status
    ).order_by(PIStageResult.id)
    for run_pk, subject, stage, pi_status in session.execute(stmt_pi):
        rows[run_pk].append(["pi", subject, stage, read_status(pi_status), None])
        total += 1
    digests = []
    for run in runs:
        merged = readmodel.merge_latest(run, rows, lambda r: (r[0], r[1], r[2]))
        counts = Counter(r[3] for r in merged)
        digests.append(RunDigest(run, sorted(merged, key=lambda r: r[:3]), dict(counts)))
    return digests, total


def _blame(findings: Sequence[status.StatusFinding]) -> Counter[Suite]:
    """Failures of the tests suite per suite column (Note: [Every outcome reaches a verdict]): a test's
    failure counts in the suites whose results its test file recorded (in every suite with results when
    its file recorded none), a run that did not complete in every suite with results (every suite when
    there are none), so a column with a broken test is never green."""
    files: dict[Suite, set[str]] = defaultdict(set)
    for f in findings:
        if f.key.suite is not Suite.TESTS and f.nodeid:
            files[f.key.suite].add(f.nodeid.split("::", 1)[0])
    with_results: set[Suite] = {f.key.suite for f in findings if f.key.suite is not Suite.TESTS} or set(
        SUITES
    )
    blamed: Counter[Suite] = Counter()
    for f in findings:
        if f.key.suite is not Suite.TESTS or f.verdict not in _BAD:
            continue
        where = f.nodeid.split("::", 1)[0]
        owners = {suite for suite, names in files.items() if where in names}
        for suite in owners if owners and f.key.workload != RUN_SUBJECT else with_results:
            blamed[suite] += 1
    return blamed


def _before(runs: Sequence[RunInfo], run: RunInfo | None) -> RunInfo | None:
    """The run of ``run``'s cell key just before it in history (``runs`` in history order)."""
    if run is None:
        return None
    earlier = [r for r in runs if r.cell_key == run.cell_key and r.order < run.order]
    return earlier[-1] if earlier else None


def _grid(
    reports: Sequence[report.CellReport],
    medians: dict[int, dict[pairwise.PerfKey, float]],
    outcomes: dict[int, Counter[str]],
    synthetic: set[str],
    runs: Sequence[RunInfo] = (),
) -> list[GridRow]:
    grid = []
    for cell in reports:
        by_suite: dict[Suite, Counter[str]] = {s: Counter() for s in Suite}
        for f in cell.findings:
            by_suite[f.key.suite][f.verdict.value] += 1
        regressed = Counter(r.key.suite for r in cell.regressions)
        summary = {
            s: SuiteSummary(s.value, dict(by_suite[s]), _state(by_suite[s], bool(regressed[s])), regressed[s])
            for s in Suite
        }
        blamed = _blame(cell.findings)
        summaries = tuple(
            replace(summary[s], state="bad", broken_tests=blamed[s]) if blamed[s] else summary[s]
            for s in SUITES
        )
        run_medians = medians.get(cell.run.pk, {})
        speedups = tuple(Speedup(m, ref, *pairwise.speedups(run_medians, m, ref)) for m, ref in HEADLINES)
        grid.append(
            GridRow(
                run=cell.run,
                baseline=cell.baseline,
                suites=summaries,
                outcomes=dict(outcomes.get(cell.run.pk, {})),
                speedups=speedups,
                new_regressions=sum(r.new for r in cell.regressions),
                regressions=len(cell.regressions),
                synthetic=cell.run.cell_key in synthetic,
                tests=summary[Suite.TESTS],
                failing_since=cell.failing_since,
                before_failing=_before(runs, cell.failing_since),
            )
        )
    return grid  # in the order of the report: natural order of cell ids


def _pi_rows(
    session: Session, latest: Sequence[RunInfo], reports: Sequence[report.CellReport] = ()
) -> list[PIStackRow]:
    per_pk: dict[int, list[loader.PIRow]] = defaultdict(list)
    for row in loader.load_pi_rows(session, [pk for r in latest for pk in r.pks]):
        per_pk[row.run_pk].append(row)
    merged = [
        (r, row) for r in latest for row in readmodel.merge_latest(r, per_pk, lambda x: (x.subject, x.stage))
    ]
    stacks: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for r in latest:
        ident = (_gpu(r), r.triton_version or "-", r.torch_version or "-", r.cuda_runtime or "-")
        entry = stacks.setdefault(ident, {"cells": set(), "stages": defaultdict(Counter), "failures": []})
        entry["cells"].add(r.cell_id)
    for run, row in merged:
        triton = row.triton_version or run.triton_version or "-"
        ident = (_gpu(run), triton, run.torch_version or "-", run.cuda_runtime or "-")
        entry = stacks.setdefault(
            ident, {"cells": {run.cell_id}, "stages": defaultdict(Counter), "failures": []}
        )
        entry["stages"][row.stage][row.status] += 1
        if row.status not in (PASSING_STATUS[Suite.PI], SKIP_STATUS):
            entry["failures"].append(
                PIFailure(run.cell_id, run.uid, row.subject, row.stage, row.status, row.message, row.nodeid)
            )
    pi_files = {row.nodeid.split("::", 1)[0] for rows in per_pk.values() for row in rows if row.nodeid}
    for cell in reports:  # tests of a PI test file that failed without a result, and unfinished runs
        run = cell.run
        ident = (_gpu(run), run.triton_version or "-", run.torch_version or "-", run.cuda_runtime or "-")
        for f in cell.findings:
            where = f.nodeid.split("::", 1)[0]
            if f.key.suite is Suite.TESTS and f.verdict in _BAD and (where in pi_files or not f.nodeid):
                entry = stacks.setdefault(
                    ident, {"cells": {run.cell_id}, "stages": defaultdict(Counter), "failures": []}
                )
                entry.setdefault("broken", 0)
                entry["broken"] += 1
                subject = f.key.workload if f.nodeid else f"the run ({f.actual})"
                entry["failures"].append(
                    PIFailure(run.cell_id, run.uid, subject, "tests", f.actual or "", f.message, f.nodeid)
                )
    result = []
    for (gpu, triton, torch, cuda), entry in stacks.items():
        if not entry["stages"]:
            continue
        failures = sorted(
            entry["failures"],
            key=lambda f: (PI_STAGES.index(f.stage) if f.stage in PI_STAGES else 99, f.subject),
        )
        result.append(
            PIStackRow(
                gpu,
                triton,
                torch,
                cuda,
                tuple(sorted(entry["cells"])),
                {k: dict(v) for k, v in entry["stages"].items()},
                tuple(failures),
                entry.get("broken", 0),
            )
        )
    # By machine first (a GPU's failures never sit among a CPU cell's skips), newest versions first.
    by_versions = sorted(
        result, key=lambda r: (natural_key(r.triton), natural_key(r.torch), natural_key(r.cuda)), reverse=True
    )
    return sorted(by_versions, key=lambda r: (r.gpu == "no GPU", r.gpu))


def _gpu(run: RunInfo) -> str:
    return run.gpu_name or "no GPU"


def build_site(
    session: Session, thresholds: Thresholds, now: dt.datetime | None = None, paper: Paper | None = None
) -> Site:
    """Everything the pages show, from the store behind ``session`` (and ``paper``'s figures)."""
    every = readmodel.Selection(pick=readmodel.Pick.LOGICAL)
    runs = readmodel.select_runs(readmodel.load_runs(session), every)
    medians = logical.merge_medians(session, runs, loader.load_perf_medians(session))
    detected = (
        report.detect(session, thresholds, runs=runs, medians=medians)
        if runs
        else report.RegressionReport(())
    )
    latest = [c.run for c in detected.cells]
    outcomes = logical.outcome_counts(session, latest)
    synthetic = _synthetic_cells(session)
    by_uid = {r.uid: r for r in runs}
    workloads = workload_views(runs, medians, detected.cells, thresholds)
    pages = {w.name: w.slug for w in workloads}
    regressions = []
    for cell in detected.cells:
        for i, r in enumerate(cell.regressions):
            anchor = f"r-{slug(cell.run.uid)}-{i}"  # a fragment, one per run whatever its uid holds
            page = pages.get(r.key.workload) if r.key.suite is Suite.PERFORMANCE else None
            regressions.append(RegressionView(anchor, r, cell.run, cell.baseline, page))
    regressions.sort(key=lambda v: (not v.regression.new, v.run.cell_id, v.regression.kind.value))
    improvements: list[tuple[RunInfo, str]] = []
    for cell in detected.cells:
        improvements.extend(
            (cell.run, f"{label}: now passes; update expected.toml") for label in cell.improvements
        )
        if cell.comparison is not None:
            improvements.extend(
                (cell.run, f"performance:{c.workload}:{c.mode}: x{c.ratio:.3f}, p={c.p_value:.2g}")
                for c in cell.comparison.improvements
            )
    digests, total = _digests(session, runs)
    pairs = tuple((c.baseline, c.run, c.comparison) for c in detected.cells if c.baseline is not None)
    return Site(
        generated_at=now or dt.datetime.now(dt.timezone.utc),
        runs=tuple(runs),
        grid=tuple(_grid(detected.cells, medians, outcomes, synthetic, runs)),
        regressions=tuple(regressions),
        improvements=tuple(improvements),
        pi_rows=tuple(_pi_rows(session, latest, detected.cells)),
        workloads=tuple(workloads),
        digests=tuple(digests),
        pairs=pairs,
        synthetic=any(r.cell_key in synthetic for r in runs),
        result_count=total,
        thresholds=thresholds,
        compatibility=build_table(session),
        extra={"by_uid": by_uid},
        fuzz=fuzz_rows(session, runs),
        training=_training(session),
        paper=paper,
        paper_runs=tuple(compare_run(session, paper, r) for r in head_runs(session)) if paper else (),
    )


def _training(session: Session) -> TrainingView:
    """The training view of ``grace-matrix report`` (the report of the training workloads and their
    twins: per cell and workload, the latest run that has it), so that the pages and the report agree."""
    names = training_names(session)
    return build_training(build_report(session, workloads=names)) if names else TrainingView(())
