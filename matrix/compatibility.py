"""Which parts of GraCE work in each cell of the matrix, and why each failure failed.

Problem: a user picking a PyTorch x Triton x CUDA stack needs one table that says, per cell, whether
grace imports, whether its backend gives eager's values, whether CGCT and the PTX rewrite work on that
torch and Triton, and whether the GPU stages pass, with the reason of every failure. The facts are
spread over correctness results, PI stage results and diagnostics, several runs may hold one cell's
results, and known failures (expected.toml) must not read as breakage.

Design: ``build_table`` picks one logical run per cell key (the same matrix cell id on the same GPU): by
default the latest finished run, the runs of one cell sharing a label counted as one
(``matrix.readmodel.select_runs``, as every reader selects them); with ``--run``/``--label`` every
selected run of the cell, merged. Per result key the latest run that recorded it wins. Its results are split
into parts (``Part``):

- ``import``: evidence that grace was imported: a correctness result of ``cgct-fake-cuda`` (its module
  imports grace), of a grace mode that got past ``suites.modes.grace_reason`` (any status but ``skip``,
  or a skip whose reason starts with "grace": the API or a technique is missing, so the import worked),
  or a diagnostic. It fails on a result whose reason says "grace cannot be imported".
- ``backend``: correctness of ``grace-cpu`` on a cell without GPU, of ``grace``, ``grace-cgct`` and
  ``grace-cgct-pi`` on a cell with one.
- ``cgct``: correctness of ``cgct-fake-cuda`` (the CGCT stage suite).
- ``ptx``: PI stages locate, rewrite and assemble (reachable without a GPU).
- ``gpu``: PI stages load, patch, numeric, vendor_match and vendor_update, and the GPU grace modes;
  not run on a cell without GPU.

``import``, ``backend`` and ``cgct`` do not apply to triton-only cells (no torch there). ``skip`` and
``model_fail_to_load`` are not judged (counted per reason instead); a failure that an expectation covers
(``matrix.regressions.status.judge_one`` says XFAIL or FLAKY) is expected, with the expectation's reason.
An ``install_failed`` run fails every part that applies, with the run's message as the reason. A test
that failed without recording the result that explains it, and a run that did not complete (the
``tests`` suite, Note: [Every outcome reaches a verdict]), fail the parts whose results that test's
file recorded (every judged part for a run, or for a file that recorded none).

Verdict of a part: ``fail`` when any failure is not expected; else ``expected-fail`` when nothing passed
and ``partial`` when something did; else ``pass``; ``not-run`` when nothing was judged; ``n/a``.

Invariants: read-only; the table is frozen and sorted (rows in matrix order, failures by subject), so
rendering one store twice gives the same bytes; no text leaves here with a machine path in it
(``matrix.text.clean_text``); no torch import (the dashboards build this table too).
"""

from __future__ import annotations

import enum
import fnmatch
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from matrix import readmodel
from matrix.errors import ConfigError
from matrix.readmodel import RunInfo
from matrix.regressions import loader, status
from matrix.regressions.observations import RUN_SUBJECT, Observation, ResultKey, Suite, natural_key
from matrix.regressions.status import Expectation
from matrix.store.models import Diagnostic, RunStatus
from matrix.text import clean_text
from suites.modes import Mode
from suites.records import CorrectnessStatus, PIStage

COMPATIBILITY_FORMAT = 1

CGCT_MODE = "cgct-fake-cuda"  # suites/test_cgct_stages.py
GPU_MODES = (Mode.GRACE.value, Mode.GRACE_CGCT.value, Mode.GRACE_CGCT_PI.value)
CPU_MODES = (Mode.GRACE_CPU.value,)
PTX_STAGES = (PIStage.LOCATE.value, PIStage.REWRITE.value, PIStage.ASSEMBLE.value)
GPU_STAGES = tuple(s.value for s in PIStage if s.value not in PTX_STAGES)
NOT_JUDGED = (CorrectnessStatus.SKIP.value, CorrectnessStatus.MODEL_FAIL_TO_LOAD.value)
IMPORT_FAILURE = "grace cannot be imported"  # suites.modes.grace_reason
TRITON_ONLY = "triton-only"


class Part(str, enum.Enum):
    IMPORT = "import"
    BACKEND = "backend"
    CGCT = "cgct"
    PTX = "ptx"
    GPU = "gpu"


class Verdict(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    EXPECTED_FAIL = "expected-fail"
    PARTIAL = "partial"
    NOT_RUN = "not-run"
    NOT_APPLICABLE = "n/a"


TORCH_PARTS = (Part.IMPORT, Part.BACKEND, Part.CGCT)  # n/a in a triton-only cell
NO_TORCH = "no torch in a triton-only cell"

PART_HELP = {
    Part.IMPORT: "grace imports in the cell (a grace-mode, CGCT or diagnostic result shows it)",
    Part.BACKEND: "grace.compile gives eager's values: grace-cpu without a GPU; grace, grace-cgct and "
    "grace-cgct-pi with one",
    Part.CGCT: "CGCT finds and moves the CPU work of a graph on this torch (cgct-fake-cuda, no GPU needed)",
    Part.PTX: "parameter indirection locates, rewrites and assembles Triton's PTX (no GPU needed)",
    Part.GPU: "parameter indirection loads, patches and matches on the GPU; the grace modes on the GPU",
}
"""What each part means, for the document and the dashboard page."""

_LABEL = {
    Verdict.PASS: "pass",
    Verdict.FAIL: "FAIL",
    Verdict.EXPECTED_FAIL: "expected",
    Verdict.PARTIAL: "partial",
}
_STATE = {Verdict.PASS: "ok", Verdict.FAIL: "bad", Verdict.EXPECTED_FAIL: "warn", Verdict.PARTIAL: "warn"}


@dataclass(frozen=True, order=True)
class Failure:
    """One failing result. ``reason`` is the expectation's reason when ``expected``, else what the test
    said; ``message`` is what the test said when it differs from ``reason``."""

    expected: bool
    subject: str
    status: str
    reason: str
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PartResult:
    """One part in one cell: the verdict, ``passed`` of ``judged`` results, failures sorted (unexpected
    first), and the results not judged as (status and reason, count) pairs."""

    part: Part
    verdict: Verdict
    passed: int = 0
    judged: int = 0
    failures: tuple[Failure, ...] = ()
    not_judged: tuple[tuple[str, int], ...] = ()
    note: str = ""  # why a part is n/a or not run

    @property
    def text(self) -> str:
        """The summary table's cell: ``pass 12/12``, ``FAIL 3/12``, ``expected 0/2``, ``-``, ``n/a``."""
        if self.verdict is Verdict.NOT_APPLICABLE:
            return "n/a"
        if self.verdict is Verdict.NOT_RUN:
            return "-"
        return f"{_LABEL[self.verdict]} {self.passed}/{self.judged}"

    @property
    def state(self) -> str:
        """CSS state of the dashboards: ok, bad, warn or none."""
        return _STATE.get(self.verdict, "none")

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "passed": self.passed,
            "judged": self.judged,
            "failures": [f.to_dict() for f in self.failures],
            "not_judged": [{"reason": reason, "count": n} for reason, n in self.not_judged],
            "note": self.note,
        }


@dataclass(frozen=True)
class CellRow:
    """One cell key (matrix cell id on one GPU) and the parts of GraCE in it."""

    cell_id: str
    kind: str
    torch: str | None
    triton: str | None
    cuda: str | None
    gpu_name: str | None
    run_status: RunStatus
    run_uids: tuple[str, ...]
    started: str  # start of the (first selected) run, "YYYY-MM-DD HH:MM UTC"
    parts: tuple[PartResult, ...]

    def part(self, part: Part) -> PartResult:
        return next(p for p in self.parts if p.part is part)

    @property
    def has_findings(self) -> bool:
        return any(p.failures or p.not_judged for p in self.parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cell": self.cell_id,
            "kind": self.kind,
            "torch": self.torch,
            "triton": self.triton,
            "cuda": self.cuda,
            "gpu": self.gpu_name,
            "run_status": self.run_status,
            "runs": list(self.run_uids),
            "started": self.started,
            "parts": {p.part.value: p.to_dict() for p in self.parts},
        }


@dataclass(frozen=True)
class CompatibilityTable:
    rows: tuple[CellRow, ...]
    selection: str  # what runs the table reads, for people

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": COMPATIBILITY_FORMAT,
            "parts": [p.value for p in Part],
            "selection": self.selection,
            "cells": [r.to_dict() for r in self.rows],
        }


# -- judging --------------------------------------------------------------------------------------------


def _subject(key: ResultKey) -> str:
    return f"{key.workload} / {key.mode}"


def judge_part(
    part: Part,
    cell_id: str,
    observations: Iterable[Observation],
    expectations: Sequence[Expectation],
) -> PartResult:
    """The verdict of ``part`` over its results (see the module docstring)."""
    passed = 0
    failures: list[Failure] = []
    skipped: Counter[str] = Counter()
    for obs in observations:
        if obs.status in NOT_JUDGED:
            skipped[f"{obs.status}: {clean_text(obs.message) or 'no reason given'}"] += 1
        elif obs.passing:
            passed += 1
        else:
            entry = status.expectation_for(expectations, cell_id, obs.key)
            found = status.judge_one(cell_id, obs, entry)
            message = clean_text(obs.message)
            if entry is not None and found.verdict in (status.Verdict.XFAIL, status.Verdict.FLAKY):
                failures.append(
                    Failure(True, _subject(obs.key), obs.status, clean_text(entry.reason), message)
                )
            else:
                failures.append(Failure(False, _subject(obs.key), obs.status, message))
    return _result(part, passed, failures, skipped)


def _result(part: Part, passed: int, failures: Sequence[Failure], skipped: Counter[str]) -> PartResult:
    judged = passed + len(failures)
    if judged == 0:
        verdict = Verdict.NOT_RUN
    elif any(not f.expected for f in failures):
        verdict = Verdict.FAIL
    elif failures:
        verdict = Verdict.PARTIAL if passed else Verdict.EXPECTED_FAIL
    else:
        verdict = Verdict.PASS
    return PartResult(
        part=part,
        verdict=verdict,
        passed=passed,
        judged=judged,
        failures=tuple(sorted(failures)),
        not_judged=tuple(sorted(skipped.items())),
        note="nothing judged" if judged == 0 else "",
    )


def judge_import(
    cell_id: str, observations: Sequence[Observation], diagnostics: int, expectations: Sequence[Expectation]
) -> PartResult:
    """``import``: records that grace was imported, against results saying it could not be."""
    evidence = diagnostics
    broken: dict[tuple[bool, str, str], list[str]] = defaultdict(list)  # (expected, status, reason) -> modes
    for obs in observations:
        if obs.key.suite is not Suite.CORRECTNESS:
            continue
        mode, reason = obs.key.mode, obs.message or ""
        if IMPORT_FAILURE in reason:
            entry = status.expectation_for(expectations, cell_id, obs.key)
            verdict = status.judge_one(cell_id, obs, entry).verdict
            expected = entry is not None and verdict in (status.Verdict.XFAIL, status.Verdict.FLAKY)
            text = clean_text(entry.reason if expected and entry is not None else reason)
            broken[(expected, obs.status, text)].append(mode)
        elif mode == CGCT_MODE or (
            mode.startswith("grace") and (obs.status not in NOT_JUDGED or reason.startswith("grace"))
        ):
            evidence += 1
    failures = [
        Failure(expected, f"{len(modes)} result(s) of {', '.join(sorted(set(modes)))}", st, reason)
        for (expected, st, reason), modes in broken.items()
    ]
    passed = evidence
    judged = evidence + sum(len(m) for m in broken.values())
    result = _result(Part.IMPORT, passed, failures, Counter())
    return replace(result, judged=judged, note="" if judged else "no result shows whether grace imports")


def judge_cell(
    run: RunInfo,
    observations: Sequence[Observation],
    diagnostics: int,
    expectations: Sequence[Expectation],
) -> tuple[PartResult, ...]:
    """Every part of one (logical) run's cell."""
    triton_only = run.kind == TRITON_ONLY
    has_gpu = bool(run.gpu_name)
    if run.status == RunStatus.INSTALL_FAILED.value:
        reason = clean_text(run.message) or "the cell's environment could not be built"
        failure = Failure(False, "environment", RunStatus.INSTALL_FAILED.value, reason)
        return tuple(
            PartResult(p, Verdict.NOT_APPLICABLE, note=NO_TORCH)
            if triton_only and p in TORCH_PARTS
            else PartResult(p, Verdict.FAIL, 0, 1, (failure,))
            for p in Part
        )

    def correctness(modes: Collection[str]) -> list[Observation]:
        return [o for o in observations if o.key.suite is Suite.CORRECTNESS and o.key.mode in modes]

    def pi(stages: Collection[str]) -> list[Observation]:
        return [o for o in observations if o.key.suite is Suite.PI and o.key.mode in stages]

    judged: dict[Part, list[Observation]] = {}
    if not triton_only:
        judged[Part.BACKEND] = correctness(GPU_MODES if has_gpu else CPU_MODES)
        judged[Part.CGCT] = correctness((CGCT_MODE,))
    judged[Part.PTX] = pi(PTX_STAGES)
    if has_gpu:
        judged[Part.GPU] = pi(GPU_STAGES) + correctness(GPU_MODES)
    blamed = _blame_test_failures(observations, judged)
    parts: list[PartResult] = []
    if triton_only:
        parts += [PartResult(p, Verdict.NOT_APPLICABLE, note=NO_TORCH) for p in TORCH_PARTS]
    else:
        parts.append(judge_import(run.cell_id, observations, diagnostics, expectations))
    for part, results in judged.items():
        parts.append(judge_part(part, run.cell_id, [*results, *blamed[part]], expectations))
    if not has_gpu:
        parts.append(PartResult(Part.GPU, Verdict.NOT_RUN, note="no GPU in this cell"))
    return tuple(parts)


def _test_file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _files(observations: Iterable[Observation], suites: Collection[Suite]) -> set[str]:
    return {_test_file(o.nodeid) for o in observations if o.key.suite in suites and o.nodeid}


def _blame_test_failures(
    observations: Sequence[Observation], judged: dict[Part, list[Observation]]
) -> dict[Part, list[Observation]]:
    """The judged failures of the ``tests`` suite (Note: [Every outcome reaches a verdict]) per part: a
    test's failure counts against the parts whose results its test file recorded (against every judged
    part when its file recorded none); a run that did not complete counts against every judged part."""
    failures = [o for o in status.bearing_verdicts(observations) if o.key.suite is Suite.TESTS]
    files = {part: {_test_file(o.nodeid) for o in results if o.nodeid} for part, results in judged.items()}
    known = set().union(*files.values()) if files else set()
    blamed: dict[Part, list[Observation]] = {part: [] for part in judged}
    for failure in failures:
        where = _test_file(failure.nodeid)
        for part in judged:
            if failure.key.workload == RUN_SUBJECT or where in files[part] or where not in known:
                blamed[part].append(failure)
    return blamed


# -- selection ------------------------------------------------------------------------------------------


def _check_known(kind: str, wanted: Sequence[str], known: Iterable[str | None]) -> None:
    have = {k for k in known if k}
    missing = [w for w in wanted if w not in have]
    if missing:
        hint = ", ".join(sorted(have, key=natural_key)[-8:]) or "none"
        raise ConfigError(f"no run has {kind} {', '.join(missing)}; the store has {kind}s: {hint}")


def select_cell_runs(
    runs: Sequence[RunInfo],
    uids: Sequence[str] = (),
    labels: Sequence[str] = (),
    cells: Sequence[str] = (),
) -> list[RunInfo]:
    """One logical run per cell key (``readmodel.select_runs``): every selected run merged when ``uids``
    or ``labels`` are given, else the latest finished logical run. ``runs`` are physical runs, oldest
    first."""
    _check_known("uid", uids, (r.uid for r in runs))
    _check_known("label", labels, (r.label for r in runs))
    _check_known("cell", cells, (r.cell_id for r in runs))
    pick = readmodel.Pick.MERGED if uids or labels else readmodel.Pick.LATEST
    selection = readmodel.Selection(tuple(uids), tuple(labels), tuple(cells), pick=pick)
    chosen = readmodel.select_runs(runs, selection)
    if not chosen and pick is readmodel.Pick.MERGED:
        raise ConfigError("no run matches --run, --label and --cell together; loosen the selection")
    return chosen


def _describe(
    uids: Sequence[str], labels: Sequence[str], cells: Sequence[str], workloads: Sequence[str]
) -> str:
    if uids or labels:
        what = [f"run {u}" for u in uids] + [f"label {x}" for x in labels]
        text = "the runs of " + ", ".join(what) + " (merged per cell; per result the latest run wins)"
    else:
        text = "the latest finished run of every cell (runs of one cell sharing a label count as one)"
    if cells:
        text += "; cells " + ", ".join(cells)
    if workloads:
        text += "; workloads matching " + ", ".join(workloads)
    return text


def _diagnostic_counts(session: Session, run_pks: Collection[int]) -> dict[int, int]:
    if not run_pks:
        return {}
    stmt = (
        select(Diagnostic.run_pk, func.count())
        .where(Diagnostic.run_pk.in_(sorted(run_pks)))
        .group_by(Diagnostic.run_pk)
    )
    return {pk: int(n) for pk, n in session.execute(stmt)}


def build_table(
    session: Session,
    uids: Sequence[str] = (),
    labels: Sequence[str] = (),
    cells: Sequence[str] = (),
    workloads: Sequence[str] = (),
    expectations: Sequence[Expectation] | None = None,
    order: Sequence[str] = (),
) -> CompatibilityTable:
    """The compatibility table of the selected runs (see ``select_cell_runs``). ``expectations``:
    default those in the store; ``order``: matrix cell ids in matrix order (others follow, naturally
    sorted); ``workloads``: fnmatch patterns over workload names and PI subjects."""
    chosen = select_cell_runs(readmodel.load_runs(session), uids, labels, cells)
    if expectations is None:
        expectations = loader.load_expectations(session)
    pks = {pk for r in chosen for pk in r.pks}
    per_pk = loader.load_observations(session, pks) if pks else {}
    diagnostics = _diagnostic_counts(session, pks)
    rank = {cell_id: i for i, cell_id in enumerate(order)}
    rows = []
    for run in chosen:
        # Judged over every suite first: a test's own performance record may explain its failure.
        merged = status.bearing_verdicts(readmodel.merge_latest(run, per_pk, lambda o: o.key))
        performance_only = _files(merged, {Suite.PERFORMANCE}) - _files(merged, {Suite.CORRECTNESS, Suite.PI})
        wanted = [
            o
            for o in merged
            if o.key.suite is not Suite.PERFORMANCE
            and not (o.key.suite is Suite.TESTS and _test_file(o.nodeid) in performance_only)
            and (not workloads or any(fnmatch.fnmatchcase(o.key.workload, w) for w in workloads))
        ]
        observations = sorted(status.merge_observations(wanted).values(), key=lambda o: o.key)
        count = sum(diagnostics.get(pk, 0) for pk in run.pks)
        rows.append(
            CellRow(
                cell_id=run.cell_id,
                kind=run.kind,
                torch=run.torch_version,
                triton=run.triton_version,
                cuda=run.cuda_runtime,
                gpu_name=run.gpu_name,
                run_status=run.status,
                run_uids=run.uids,
                started=f"{run.started_at:%Y-%m-%d %H:%M} UTC",
                parts=judge_cell(run, observations, count, expectations),
            )
        )
    rows.sort(key=lambda r: (rank.get(r.cell_id, len(rank)), natural_key(r.cell_id), r.gpu_name or ""))
    return CompatibilityTable(tuple(rows), _describe(uids, labels, cells, workloads))
