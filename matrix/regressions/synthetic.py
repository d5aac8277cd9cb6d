"""Synthetic results for tests, benchmarks and the dashboard demo, written through the store models.

Problem: regression detection and the dashboards must be exercised before (and besides) real GPU
results exist: on histories with a known step, a known PI failure, a known status failure, and at the
scale of a long nightly history.

Design: ``seed_history`` writes ``nights`` runs per cell with raw samples drawn from a seeded RNG around a
per-workload x mode level, plus the injected faults it is given. ``seed_demo`` takes whatever the store
already holds (e.g. the committed results after ``grace-matrix ingest``; a synthetic history if it is
empty), clones the latest logical run of one cell (``matrix.readmodel.group_runs``: the runs of a cell
sharing a label, merged per result) as a new run and injects one performance regression and one PI
failure into it, so the demo can be redone on real results.

Invariants: every cell written here carries ``extra["synthetic"] = True`` and every run a label starting
with ``synthetic-`` or ``demo-``, so synthetic figures are never mistaken for measurements (the
dashboards badge them). Deterministic for a given seed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import random
import statistics
import uuid
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from matrix import readmodel
from matrix.errors import ConfigError
from matrix.readmodel import RunInfo
from matrix.regressions.errors import RegressionsError
from matrix.store.check import find_unreadable
from matrix.store.models import (
    Cell,
    CorrectnessResult,
    Diagnostic,
    PerformanceResult,
    PIStageResult,
    Run,
    RunStatus,
    TestOutcome,
    Workload,
)
from suites.records import PIStage

SCRIPT_PAYLOAD = "<script>window.__grace_pwned = 1</script>"
"""Put in seeded failure messages: a page that runs it is not escaping what tests print."""

_MODE_FACTOR = {"eager": 2.4, "inductor": 1.3, "pt2cg": 1.0, "grace": 0.9}
_PI_STAGES = tuple(s.value for s in PIStage)


@dataclass(frozen=True)
class SyntheticCell:
    cell_id: str
    torch_version: str | None
    triton_version: str | None
    cuda_runtime: str | None
    gpu_name: str | None = "NVIDIA H200"


DEFAULT_CELLS = (
    SyntheticCell("torch-2.9", "2.9.1", "3.5.1", "12.8"),
    SyntheticCell("torch-2.10", "2.10.0", "3.6.0", "12.8"),
    SyntheticCell("torch-2.11", "2.11.0", "3.6.0", "13.0"),
)
DEFAULT_WORKLOADS = (
    "xlnet_lm",
    "debertav2_qa",
    "mt5_small",
    "pyhpc_eos",
    "deeprecommender",
    "seed_elementwise",
)


@dataclass(frozen=True)
class SeededRegression:
    """Latency of ``workload`` x ``mode`` on ``cell_id`` multiplied by ``factor`` from night ``night`` on."""

    cell_id: str
    workload: str
    mode: str
    factor: float
    night: int


@dataclass(frozen=True)
class SeededFailure:
    """From night ``night`` on, a result turns into ``status`` with ``message``. ``suite`` is
    correctness (workload, mode) or pi (workload is the subject, mode the stage)."""

    cell_id: str
    suite: str
    workload: str
    mode: str
    status: str
    message: str
    night: int


@dataclass(frozen=True)
class SyntheticSpec:
    cells: tuple[SyntheticCell, ...] = DEFAULT_CELLS
    nights: int = 12
    workloads: tuple[str, ...] = DEFAULT_WORKLOADS
    modes: tuple[str, ...] = ("eager", "inductor", "pt2cg", "grace")
    samples: int = 30
    sample_noise: float = 0.02  # relative spread of samples within a run
    night_noise: float = 0.01  # relative spread of a run's level from night to night
    pi_subjects: tuple[str, ...] = ("triton_poi_fused_add_0", "triton_red_fused_sum_1")
    seed: int = 0
    start: dt.datetime = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.timezone.utc)
    regressions: tuple[SeededRegression, ...] = ()
    failures: tuple[SeededFailure, ...] = field(default=())


def results_per_run(spec: SyntheticSpec) -> int:
    """Result rows (correctness, performance and PI stage) that one run of ``spec`` writes."""
    return 2 * len(spec.workloads) * len(spec.modes) + len(spec.pi_subjects) * len(_PI_STAGES)


def spec_for_results(target: int, cells: int = 5, workloads: int = 25, seed: int = 0) -> SyntheticSpec:
    """A history of at least ``target`` result rows: ``cells`` cells, ``workloads`` workloads, six modes,
    five PI subjects, as many nights as it takes (for benchmarks of detection and rendering)."""
    modes = ("eager", "inductor", "pt2cg", "pt2cg-nopartition", "grace", "grace-cgct")
    cell_specs = tuple(
        SyntheticCell(f"torch-2.{4 + i}", f"2.{4 + i}.0", f"3.{i}.0", "12.4" if i < 4 else "12.8")
        for i in range(cells)
    )
    spec = SyntheticSpec(
        cells=cell_specs,
        workloads=tuple(f"workload_{i:03d}" for i in range(workloads)),
        modes=modes,
        pi_subjects=tuple(f"triton_poi_fused_{i}" for i in range(5)),
        seed=seed,
    )
    per_night = results_per_run(spec) * cells
    return replace(spec, nights=max(2, -(-target // per_night)))


def _fingerprint(cell: SyntheticCell) -> str:
    parts = (cell.cell_id, cell.torch_version, cell.triton_version, cell.cuda_runtime, cell.gpu_name)
    text = "synthetic|" + "|".join(str(p) for p in parts)
    return hashlib.sha256(text.encode()).hexdigest()


def _get_cell(session: Session, cell: SyntheticCell) -> Cell:
    fingerprint = _fingerprint(cell)
    found = session.execute(select(Cell).where(Cell.fingerprint == fingerprint)).scalar_one_or_none()
    if found is not None:
        return found
    row = Cell(
        fingerprint=fingerprint,
        cell_id=cell.cell_id,
        kind="venv",
        torch_version=cell.torch_version,
        triton_version=cell.triton_version,
        cuda_runtime=cell.cuda_runtime,
        gpu_name=cell.gpu_name,
        gpu_capability="9.0" if cell.gpu_name else None,
        python_version="3.11",
        platform="linux-x86_64",
        extra={"synthetic": True},
    )
    session.add(row)
    session.flush()
    return row


def _get_workloads(session: Session, names: Sequence[str]) -> dict[str, int]:
    pks: dict[str, int] = {}
    for name in names:
        row = session.execute(
            select(Workload).where(Workload.name == name, Workload.code_hash == "synthetic")
        ).scalar_one_or_none()
        if row is None:
            row = Workload(name=name, code_hash="synthetic", tier="standard", tags=["synthetic"])
            session.add(row)
            session.flush()
        pks[name] = row.id
    return pks


def seed_history(session: Session, spec: SyntheticSpec) -> list[int]:
    """Write ``spec.nights`` runs per cell; returns the new runs' primary keys, oldest first."""
    rng = random.Random(spec.seed)
    workload_pks = _get_workloads(session, spec.workloads)
    levels = {w: rng.uniform(0.3, 8.0) for w in spec.workloads}
    run_pks: list[int] = []
    for night in range(spec.nights):
        when = spec.start + dt.timedelta(days=night)
        for cell_index, cell in enumerate(spec.cells):
            cell_row = _get_cell(session, cell)
            run = Run(
                uid=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                cell_pk=cell_row.id,
                status=RunStatus.COMPLETE.value,
                started_at=when + dt.timedelta(minutes=cell_index),
                finished_at=when + dt.timedelta(minutes=cell_index + 30),
                label=f"synthetic-nightly-{when:%Y-%m-%d}",
                git_sha=hashlib.sha1(f"{spec.seed}-{night}".encode()).hexdigest(),
                host="synthetic",
                exit_code=0,
            )
            session.add(run)
            session.flush()
            run_pks.append(run.id)
            _write_results(session, spec, rng, run.id, cell, night, when, levels, workload_pks)
    return run_pks


def _fault(
    spec: SyntheticSpec, cell: SyntheticCell, suite: str, workload: str, mode: str, night: int
) -> SeededFailure | None:
    for f in spec.failures:
        if (f.cell_id, f.suite, f.workload, f.mode) == (
            cell.cell_id,
            suite,
            workload,
            mode,
        ) and night >= f.night:
            return f
    return None


def _write_results(
    session: Session,
    spec: SyntheticSpec,
    rng: random.Random,
    run_pk: int,
    cell: SyntheticCell,
    night: int,
    when: dt.datetime,
    levels: dict[str, float],
    workload_pks: dict[str, int],
) -> None:
    correctness: list[dict[str, Any]] = []
    performance: list[dict[str, Any]] = []
    outcomes: list[dict[str, Any]] = []
    for workload in spec.workloads:
        for mode in spec.modes:
            base = levels[workload] * _MODE_FACTOR.get(mode, 1.0) * (1.0 + rng.gauss(0.0, spec.night_noise))
            for r in spec.regressions:
                if (r.cell_id, r.workload, r.mode) == (cell.cell_id, workload, mode) and night >= r.night:
                    base *= r.factor
            fault = _fault(spec, cell, "correctness", workload, mode, night)
            node = f"suites/test_correctness.py::test_correctness[{workload}-{mode}]"
            status = fault.status if fault else "pass"
            correctness.append(
                {
                    "run_pk": run_pk,
                    "record_key": f"correctness/{workload}/{mode}",
                    "nodeid": node,
                    "recorded_at": when,
                    "workload_pk": workload_pks[workload],
                    "mode": mode,
                    "status": status,
                    "reason": fault.message if fault else None,
                    "errors": {"max_abs": abs(rng.gauss(0, 1e-6)), "cosine": 1.0},
                    "tolerance": {"max_abs": 1e-4},
                    "details": {},
                }
            )
            outcomes.append(
                {
                    "run_pk": run_pk,
                    "record_key": node,
                    "nodeid": node,
                    "recorded_at": when,
                    "outcome": "passed" if status == "pass" else "failed",
                    "duration_s": rng.uniform(0.5, 5.0),
                    "message": fault.message if fault else None,
                }
            )
            samples = [
                round(base * (1.0 + abs(rng.gauss(0.0, spec.sample_noise))), 6) for _ in range(spec.samples)
            ]
            performance.append(
                {
                    "run_pk": run_pk,
                    "record_key": f"performance/{workload}/{mode}",
                    "nodeid": f"suites/test_performance.py::test_performance[{workload}-{mode}]",
                    "recorded_at": when,
                    "workload_pk": workload_pks[workload],
                    "mode": mode,
                    "status": "ok",
                    "samples_ms": samples,
                    "median_ms": statistics.median(samples),
                    "floor_ms": levels[workload] * 0.85,
                    "compile_s": rng.uniform(5, 60),
                    "kernel_launches": 40,
                    "graph_launches": 0 if mode in ("eager", "inductor") else 1,
                    "details": {},
                }
            )
    pi: list[dict[str, Any]] = []
    for subject in spec.pi_subjects:
        for stage in _PI_STAGES:
            fault = _fault(spec, cell, "pi", subject, stage, night)
            pi.append(
                {
                    "run_pk": run_pk,
                    "record_key": f"pi/{subject}/{stage}",
                    "nodeid": f"suites/test_pi.py::test_pi_stages[{subject}]",
                    "recorded_at": when,
                    "subject": subject,
                    "stage": stage,
                    "status": fault.status if fault else "pass",
                    "message": fault.message if fault else "",
                    "triton_version": cell.triton_version,
                    "details": {},
                }
            )
    for model, rows in (
        (CorrectnessResult, correctness),
        (PerformanceResult, performance),
        (PIStageResult, pi),
        (TestOutcome, outcomes),
    ):
        if rows:
            session.execute(insert(model), rows)


@dataclass(frozen=True)
class DemoSeed:
    run_uid: str
    cell_id: str
    regression: tuple[str, str]  # workload, mode
    factor: float
    pi_subject: str
    pi_stage: str
    message: str


_CLONED_MODELS = (CorrectnessResult, PerformanceResult, PIStageResult, Diagnostic, TestOutcome)


def _copied_columns(model: type[Any]) -> tuple[str, ...]:
    """Every column of a result table except its identity and run (derived, so new columns are copied)."""
    return tuple(c.key for c in model.__table__.columns if c.key not in {"id", "run_pk", "recorded_at"})


def _merge_key(model: type[Any], workloads: dict[int, tuple[str, str]]) -> Callable[[Any], Hashable]:
    """What a later run of a logical run replaces: a workload x mode (by name and tier, as the regressions
    compare them: a workload whose code changed between two runs is one workload), a PI subject x stage,
    a test."""
    if model is PIStageResult:
        return lambda r: (r.subject, r.stage)
    if model is TestOutcome:
        return lambda r: r.record_key
    return lambda r: (workloads[r.workload_pk], r.mode)


def _merged_rows(session: Session, model: type[Any], run: RunInfo) -> list[Any]:
    per_pk = {
        pk: session.execute(select(model).where(model.run_pk == pk).order_by(model.id)).scalars().all()
        for pk in run.pks
    }
    workloads = {w.id: (w.name, w.tier) for w in session.execute(select(Workload)).scalars()}
    return readmodel.merge_latest(run, per_pk, _merge_key(model, workloads))


def _with_samples(session: Session, run: RunInfo, min_samples: int) -> list[PerformanceResult]:
    """The ``ok`` performance rows of ``run`` with ``min_samples`` samples or more; none when a row of the
    run holds a value no reader can use (``matrix.store.check``), which a clone would copy."""
    if find_unreadable(session, run.pks):
        return []
    rows = _merged_rows(session, PerformanceResult, run)
    return [p for p in rows if p.status == "ok" and len(p.samples_ms or ()) >= min_samples]


def check_factor(factor: float) -> None:
    """A ``ConfigError`` for a slow-down that would not leave a latency (zero, negative, not finite)."""
    if not (math.isfinite(factor) and factor > 0):
        raise ConfigError(f"--factor {factor}: give a finite slow-down above zero (e.g. 1.25)")


def seed_demo(
    session: Session,
    factor: float = 1.25,
    message: str = f"seeded PI failure: cuGraphKernelNodeSetParams rejected the slot table {SCRIPT_PAYLOAD}",
    min_samples: int = 5,
) -> DemoSeed:
    """Clone the latest complete logical run that has performance samples into a new run one day after
    its latest member, with one workload x mode slowed by ``factor`` and one PI stage failing with
    ``message``. An empty store is first given a synthetic history. A ``factor`` ``check_factor``
    refuses is refused before anything is written."""
    check_factor(factor)
    if session.execute(select(Run.id).limit(1)).first() is None:
        seed_history(session, SyntheticSpec())
    candidates = [
        r
        for r in readmodel.select_runs(
            readmodel.load_runs(session), readmodel.Selection(pick=readmodel.Pick.LOGICAL)
        )
        if r.status == RunStatus.COMPLETE.value
    ]
    found: tuple[RunInfo, PerformanceResult] | None = None
    for info in reversed(candidates):
        if usable := _with_samples(session, info, min_samples):
            found = info, sorted(usable, key=lambda p: p.record_key)[0]
            break
    if found is None:
        raise RegressionsError(
            f"no complete run with performance samples (>= {min_samples}) and no unreadable row to seed a "
            "regression into; ingest results or seed a synthetic history first"
        )
    info, victim = found
    source = session.get_one(Run, info.pk)  # the latest member
    started = source.started_at + dt.timedelta(days=1)
    cloned = source.uid if len(info.uids) == 1 else f"{len(info.uids)} runs {', '.join(info.uids)}"
    clone = Run(
        uid=str(uuid.uuid4()),
        cell_pk=source.cell_pk,
        status=RunStatus.COMPLETE.value,
        started_at=started,
        finished_at=started + dt.timedelta(minutes=30),
        label=f"demo-seeded-{started:%Y-%m-%d}",
        git_sha=source.git_sha,
        host=source.host,
        command="seeded demo: clone of run " + cloned,
        exit_code=0,
    )
    session.add(clone)
    session.flush()
    for model in _CLONED_MODELS:
        columns = _copied_columns(model)
        payload, keys = [], set()
        for r in _merged_rows(session, model, info):
            row = {"run_pk": clone.id, "recorded_at": started, **{c: getattr(r, c) for c in columns}}
            if model is PerformanceResult and r.id == victim.id:
                row["samples_ms"] = [float(v) * factor for v in row["samples_ms"]]
                row["median_ms"] = statistics.median(row["samples_ms"])
            while row["record_key"] in keys:  # two members may have used one key for different results
                row["record_key"] += "+"
            keys.add(row["record_key"])
            payload.append(row)
        if payload:
            session.execute(insert(model), payload)
    pi_rows = (
        session.execute(
            select(PIStageResult)
            .where(PIStageResult.run_pk == clone.id, PIStageResult.status == "pass")
            .order_by(PIStageResult.record_key)
        )
        .scalars()
        .all()
    )
    target = next((p for p in pi_rows if p.stage == PIStage.PATCH.value), pi_rows[0] if pi_rows else None)
    if target is None:
        target = PIStageResult(
            run_pk=clone.id,
            record_key="pi/seeded/patch",
            nodeid="suites/test_pi.py::test_pi_stages[seeded]",
            subject="seeded_kernel",
            stage=PIStage.PATCH.value,
            status="pass",
            triton_version=source.cell.triton_version,
        )
        session.add(target)
    target.status = "fail"
    target.message = message
    session.flush()
    workload = session.get(Workload, victim.workload_pk)
    return DemoSeed(
        run_uid=clone.uid,
        cell_id=source.cell.cell_id,
        regression=(workload.name if workload else "?", victim.mode),
        factor=factor,
        pi_subject=target.subject,
        pi_stage=target.stage,
        message=message,
    )
