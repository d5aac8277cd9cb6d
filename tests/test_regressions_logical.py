"""Logical runs (matrix.readmodel.group_runs): the runs of one cell that share a label are judged as one.

The store: a synthetic history whose last night on torch-2.11 arrived as three runs of one label, the
way a GPU lease cut into calls records it: run A with the first workloads (and the PI results), run B
with the others, run C re-running one workload and one PI subject after a fix, with changed statuses.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
import uuid
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from matrix import readmodel
from matrix.readmodel import RunInfo, cell_key
from matrix.regressions import logical, report
from matrix.regressions.observations import ResultKey, Suite
from matrix.regressions.status import Verdict
from matrix.regressions.synthetic import DEFAULT_WORKLOADS, SyntheticSpec, seed_history
from matrix.regressions.thresholds import Thresholds
from matrix.store.db import open_store
from matrix.store.models import (
    Cell,
    CorrectnessResult,
    PerformanceResult,
    PIStageResult,
    Run,
    RunStatus,
    Workload,
)
from matrix.store.models import (
    TestOutcome as OutcomeRow,
)
from suites.records import PIStage

TH = Thresholds()
SPEC = SyntheticSpec(nights=8)
CELL = "torch-2.11"
LABEL = "lease-2026-01-08"
RERUN = DEFAULT_WORKLOADS[0]  # xlnet_lm: in run A, re-run by run C
LATER = DEFAULT_WORKLOADS[3:]  # recorded by run B
PI_SUBJECT = "triton_poi_fused_add_0"


@dataclasses.dataclass(frozen=True)
class Split:
    uids: tuple[str, str, str]  # runs A, B, C of the label, oldest first
    previous_uid: str  # the cell's run of the night before


def _rows(session: Session, model: Any, run_pk: int) -> list[Any]:
    return list(session.execute(select(model).where(model.run_pk == run_pk)).scalars())


def _copy(model: Any, row: Any, run_pk: int, **changes: Any) -> dict[str, Any]:
    skip = {"id", "run_pk"}
    data = {c.key: getattr(row, c.key) for c in model.__table__.columns if c.key not in skip}
    return {**data, "run_pk": run_pk, **changes}


def split_last_night(session: Session) -> Split:
    """Cut the last night's run of CELL into three runs labelled LABEL (see the module docstring).

    Run C changes: correctness RERUN/grace pass -> fail_accuracy, RERUN/eager fail_accuracy (in A) -> pass,
    performance RERUN/grace ok -> fail_to_run (no samples), RERUN/inductor 1.5x slower, PI PI_SUBJECT/patch
    pass -> fail."""
    runs = list(
        session.execute(
            select(Run)
            .join(Cell, Run.cell_pk == Cell.id)
            .where(Cell.cell_id == CELL)
            .order_by(Run.started_at)
        ).scalars()
    )
    previous, first = runs[-2], runs[-1]
    first.label = LABEL
    names = {w.id: w.name for w in session.execute(select(Workload)).scalars()}
    pk_of = {v: k for k, v in names.items()}

    def new_run(minutes: int) -> Run:
        run = Run(
            uid=str(uuid.uuid4()),
            cell_pk=first.cell_pk,
            status=RunStatus.COMPLETE.value,
            started_at=first.started_at + dt.timedelta(minutes=minutes),
            finished_at=first.started_at + dt.timedelta(minutes=minutes + 10),
            label=LABEL,
            host="synthetic",
            exit_code=0,
        )
        session.add(run)
        session.flush()
        return run

    later_pks = [pk_of[w] for w in LATER]
    second = new_run(20)
    for model in (CorrectnessResult, PerformanceResult):
        session.execute(
            update(model)
            .where(model.run_pk == first.id, model.workload_pk.in_(later_pks))
            .values(run_pk=second.id)
        )
    later_nodes = [f"[{w}-" for w in LATER]
    for outcome in _rows(session, OutcomeRow, first.id):
        if any(node in outcome.record_key for node in later_nodes):
            outcome.run_pk = second.id
    # run A had RERUN/eager failing; run C passes it
    for row in _rows(session, CorrectnessResult, first.id):
        if (names[row.workload_pk], row.mode) == (RERUN, "eager"):
            row.status, row.reason = "fail_accuracy", "rel_l2 0.3 before the fix"
    session.flush()

    third = new_run(40)
    for row in _rows(session, CorrectnessResult, first.id):
        if names[row.workload_pk] != RERUN:
            continue
        status = {"grace": "fail_accuracy", "eager": "pass"}.get(row.mode, row.status)
        session.add(
            CorrectnessResult(**_copy(CorrectnessResult, row, third.id, status=status, reason=status))
        )
    for row in _rows(session, PerformanceResult, first.id):
        if names[row.workload_pk] != RERUN:
            continue
        changes: dict[str, Any] = {}
        if row.mode == "grace":
            changes = {"status": "fail_to_run", "samples_ms": None, "median_ms": None}
        elif row.mode == "inductor":
            samples = [v * 1.5 for v in row.samples_ms]
            changes = {"samples_ms": samples, "median_ms": statistics.median(samples)}
        session.add(PerformanceResult(**_copy(PerformanceResult, row, third.id, **changes)))
    for row in _rows(session, PIStageResult, first.id):
        if row.subject == PI_SUBJECT:
            status = "fail" if row.stage == "patch" else row.status
            session.add(PIStageResult(**_copy(PIStageResult, row, third.id, status=status, message=status)))
    session.flush()
    return Split((first.uid, second.uid, third.uid), previous.uid)


@pytest.fixture(scope="module")
def split_store() -> tuple[sessionmaker[Session], Split]:
    factory = open_store("sqlite://")
    with factory.begin() as session:
        seed_history(session, SPEC)
        split = split_last_night(session)
    return factory, split


def _cell(rep: report.RegressionReport, cell_id: str = CELL) -> report.CellReport:
    (found,) = [c for c in rep.cells if c.run.cell_id == cell_id]
    return found


def test_a_label_split_over_three_runs_is_judged_as_one_run(
    split_store: tuple[sessionmaker[Session], Split],
) -> None:
    factory, split = split_store
    with factory() as session:
        rep = report.detect(session, TH)
    cell = _cell(rep)
    assert cell.run.uids == split.uids
    assert cell.run.uid == split.uids[-1]
    assert cell.baseline is not None and cell.baseline.uid == split.previous_uid  # not run B
    verdicts = {f.key: f.verdict for f in cell.findings}
    assert Verdict.MISSING not in verdicts.values()
    # every result of the night is judged once, whichever run recorded it
    per_run = 2 * len(SPEC.workloads) * len(SPEC.modes) + len(SPEC.pi_subjects) * len(PIStage)
    assert len(cell.findings) == per_run
    # the re-run's newer status wins, in both directions
    assert verdicts[ResultKey(Suite.CORRECTNESS, RERUN, "grace")] is Verdict.FAIL
    assert verdicts[ResultKey(Suite.CORRECTNESS, RERUN, "eager")] is Verdict.PASS
    assert verdicts[ResultKey(Suite.PERFORMANCE, RERUN, "grace")] is Verdict.FAIL
    assert verdicts[ResultKey(Suite.PI, PI_SUBJECT, "patch")] is Verdict.FAIL
    found = {(r.kind.value, r.key.suite.value, r.key.workload, r.key.mode, r.new) for r in cell.regressions}
    assert found == {
        ("status", "correctness", RERUN, "grace", True),
        ("status", "performance", RERUN, "grace", True),
        ("status", "pi", PI_SUBJECT, "patch", True),
        ("performance", "performance", RERUN, "inductor", True),  # run C's samples, not run A's
    }
    # the comparison covers the whole night: every workload x mode with samples on both sides
    assert cell.comparison is not None
    assert {a.workloads for a in cell.comparison.aggregates if a.mode != "grace"} == {len(SPEC.workloads)}
    assert (RERUN, "grace") in cell.comparison.only_in_baseline  # the failed re-run left no samples


def test_label_uid_and_prefix_of_any_member_name_the_logical_run(
    split_store: tuple[sessionmaker[Session], Split],
) -> None:
    factory, split = split_store
    with factory() as session:
        by_label = report.detect(session, TH, run_spec=LABEL)
        by_first_uid = report.detect(session, TH, run_spec=split.uids[0])
        by_prefix = report.detect(session, TH, run_spec=split.uids[1][:8])
        other_cells = report.detect(session, TH, run_spec="synthetic-nightly-2026-01-08")
        against = report.detect(session, TH, run_spec=split.previous_uid, baseline_spec=LABEL)
    for rep in (by_label, by_first_uid, by_prefix):
        assert [c.run.uids for c in rep.cells] == [split.uids]
        assert not any(f.verdict is Verdict.MISSING for f in rep.cells[0].findings)
    assert {c.run.cell_id for c in other_cells.cells} == {"torch-2.9", "torch-2.10"}
    base = _cell(against).baseline
    assert base is not None and base.uids == split.uids
    data = report.report_to_json(by_label)
    assert data["cells"][0]["runs"] == list(split.uids)
    assert data["cells"][0]["label"] == LABEL


def test_history_has_one_point_per_logical_run_with_the_owners_medians(
    split_store: tuple[sessionmaker[Session], Split],
) -> None:
    factory, split = split_store
    with factory() as session:
        runs = readmodel.group_runs(report.readmodel.load_runs(session))
        mine = [r for r in runs if r.cell_id == CELL]
        medians = logical.load_medians(session, mine)
        physical = report.loader.load_perf_medians(session)
    assert len(mine) == SPEC.nights
    last = mine[-1]
    assert last.uids == split.uids and last.status == RunStatus.COMPLETE.value
    assert len(medians[last.pk]) == len(SPEC.workloads) * len(SPEC.modes) - 1  # RERUN/grace failed in C
    assert (RERUN, "grace") not in medians[last.pk]
    first_pk = last.pks[0]
    assert medians[last.pk][(RERUN, "inductor")] == pytest.approx(
        1.5 * physical[first_pk][(RERUN, "inductor")]
    )
    assert medians[last.pk][(LATER[0], "eager")] == physical[last.pks[1]][(LATER[0], "eager")]


def test_unlabelled_runs_stay_separate_runs() -> None:
    factory = open_store("sqlite://")
    with factory.begin() as session:
        seed_history(session, dataclasses.replace(SPEC, nights=4))
        session.execute(update(Run).values(label=None))
        last = session.execute(select(Run).order_by(Run.started_at.desc())).scalars().first()
        assert last is not None
        dropped = session.execute(
            select(Workload.id).where(Workload.name == DEFAULT_WORKLOADS[1])
        ).scalar_one()
        for model in (CorrectnessResult, PerformanceResult):
            for row in _rows(session, model, last.id):
                if row.workload_pk == dropped:
                    session.delete(row)
        cell_id = session.get_one(Cell, last.cell_pk).cell_id
    with factory() as session:
        runs = report.readmodel.load_runs(session)
        assert readmodel.group_runs(runs) == runs  # unchanged, in the same order
        rep = report.detect(session, TH)
    cell = _cell(rep, cell_id)
    assert cell.run.members == () and cell.run.uids == (cell.run.uid,)
    missing = {(f.key.suite.value, f.key.mode) for f in cell.findings if f.verdict is Verdict.MISSING}
    assert missing == {(s, m) for s in ("correctness", "performance") for m in SPEC.modes}


def _info(pk: int, minute: int, label: str | None, status: str = "complete") -> RunInfo:
    return RunInfo(
        pk=pk,
        uid=f"{pk:04d}-uid",
        cell_id="c",
        cell_key=cell_key("c", "H200"),
        kind="venv",
        torch_version=None,
        triton_version=None,
        cuda_runtime=None,
        gpu_name="H200",
        started_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=minute),
        status=status,
        label=label,
    )


def test_group_runs_orders_folds_and_is_idempotent() -> None:
    runs = [
        _info(1, 0, "n1"),
        _info(2, 5, None),
        _info(3, 10, "n1", "crashed"),
        _info(4, 20, "n2", "running"),
        _info(5, 30, "n2"),
        _info(6, 40, "n3", "crashed"),
    ]
    other_gpu = dataclasses.replace(_info(7, 1, "n1"), cell_key=cell_key("c", "B200"))
    grouped = readmodel.group_runs([*runs, other_gpu])
    assert [r.pks for r in grouped] == [(1, 3), (7,), (2,), (4, 5), (6,)]
    n1 = grouped[0]
    assert (n1.uid, n1.pk, n1.started_at, n1.status) == ("0003-uid", 3, runs[0].started_at, "complete")
    assert grouped[3].status == "running"  # a member still runs
    assert grouped[4] == runs[5]  # one run: unchanged
    assert readmodel.group_runs(grouped) == grouped


def test_merge_latest_keeps_every_row_of_the_owner() -> None:
    run = dataclasses.replace(_info(3, 0, "n"), members=(1, 2, 3), member_uids=("a", "b", "c"))
    rows = {1: [("x", 1), ("y", 1)], 2: [("x", 2), ("x", 2.5)], 3: [("z", 3)], 9: [("y", 9)]}
    assert readmodel.merge_latest(run, rows, lambda r: r[0]) == [("y", 1), ("x", 2), ("x", 2.5), ("z", 3)]
    owner = readmodel.owners(run, {pk: [k for k, _ in v] for pk, v in rows.items()})
    assert owner == {"x": 2, "y": 1, "z": 3}
    values = {1: {"x": 10.0, "y": 11.0}, 2: {}, 3: {"z": 13.0}}
    assert readmodel.merge_owned(owner, values) == {"y": 11.0, "z": 13.0}  # x's owner has no value
