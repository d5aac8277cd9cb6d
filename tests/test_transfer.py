"""Export, ingest and merge: row-for-row round trips, idempotence, all-or-nothing ingest."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from sqlalchemy import select
from store_content import environment as store_environment

from matrix.errors import TransferError
from matrix.fingerprint import Environment
from matrix.store.access import finish_run, get_or_create_cell, get_or_create_workload, start_run
from matrix.store.db import open_store
from matrix.store.models import (
    RESULT_TABLES,
    Cell,
    CorrectnessResult,
    Diagnostic,
    PerformanceResult,
    PIStageResult,
    Run,
    RunStatus,
    Workload,
)
from matrix.store.models import TestOutcome as Outcome
from matrix.transfer import EXPORT_VERSION, RunFilter, export_jsonl, ingest_jsonl, merge_stores


def environment(cell_id: str, gpu: str | None = None) -> Environment:
    return store_environment(cell_id, gpu, python_version="3.11.7", extra={"numpy": "2.4.6"})


def populate(Session, cell_id: str, label: str, n: int = 3, status: RunStatus = RunStatus.COMPLETE) -> str:
    """One run of ``cell_id`` with ``n`` rows in every result table; returns its uid."""
    with Session.begin() as s:
        cell = get_or_create_cell(s, environment(cell_id, gpu="NVIDIA H200"))
        run = start_run(s, cell, label=label, git_sha="abc123", command="pytest suites")
        for i in range(n):
            wl = get_or_create_workload(s, f"model{i}", f"hash{i}", "smoke", ["cgct", "pi"])
            node = f"suites/test_x.py::test_{i}"
            s.add(
                Outcome(
                    run=run, record_key=node, nodeid=node, outcome="passed", duration_s=0.5 + i, worker="gw1"
                )
            )
            s.add(
                CorrectnessResult(
                    run=run,
                    record_key=f"{node}#0",
                    nodeid=node,
                    workload_pk=wl.id,
                    mode="grace",
                    status="pass",
                    errors={"max_abs": 1e-6 * i, "cosine": 0.9999},
                    tolerance={"max_abs": 1e-3},
                    details={"dtype": "float32"},
                )
            )
            s.add(
                PerformanceResult(
                    run=run,
                    record_key=f"{node}#1",
                    nodeid=node,
                    workload_pk=wl.id,
                    mode="pt2cg",
                    status="ok",
                    samples_ms=[1.0 + i, 1.1, 0.9],
                    median_ms=1.0,
                    floor_ms=0.8,
                    compile_s=12.5,
                    peak_mem_bytes=2**33 + i,
                    kernels_in_graphs=40,
                    kernel_launches=0,
                    graph_launches=1,
                    copy_bytes_per_replay=4096,
                )
            )
            s.add(
                PIStageResult(
                    run=run,
                    record_key=f"{node}#2",
                    nodeid=node,
                    subject=f"triton_poi_{i}",
                    stage="rewrite",
                    status="fail" if i == 1 else "pass",
                    message="unexpected ld.param form" if i == 1 else "",
                    triton_version="3.6.0",
                )
            )
            s.add(
                Diagnostic(
                    run=run,
                    record_key=f"{node}#3",
                    nodeid=node,
                    workload_pk=wl.id,
                    mode="grace",
                    code="cpu_scalar",
                    node="mul_1",
                    source="model.py:12 x * torch.tensor(0.5)",
                    message="<script>alert(1)</script>",
                    transformed=True,
                )
            )
        if status is not RunStatus.RUNNING:
            finish_run(s, run, status, exit_code=0, message="done")
        return run.uid


def snapshot(Session) -> dict[str, list[tuple]]:
    """Every row of every table, by named fields, integer ids replaced by what they point to."""
    out: dict[str, list[tuple]] = {}
    with Session() as s:
        out["runs"] = sorted(
            (
                r.uid,
                r.status,
                r.label,
                r.git_sha,
                r.host,
                r.pid,
                r.command,
                r.exit_code,
                r.message,
                r.started_at.replace(tzinfo=None),
                r.finished_at and r.finished_at.replace(tzinfo=None),
                r.cell.fingerprint,
            )
            for r in s.scalars(select(Run))
        )
        out["cells"] = sorted(
            tuple(
                getattr(c, col.key) if col.key != "extra" else json.dumps(c.extra, sort_keys=True)
                for col in Cell.__table__.columns
                if col.key != "id"
            )
            for c in s.scalars(select(Cell))
        )
        out["workloads"] = sorted(
            (w.name, w.code_hash, w.tier, tuple(w.tags)) for w in s.scalars(select(Workload))
        )
        for model in RESULT_TABLES:
            rows = []
            for row in s.scalars(select(model)):
                values = []
                for col in model.__table__.columns:
                    if col.key in ("id", "run_pk", "workload_pk"):
                        continue
                    value = getattr(row, col.key)
                    if isinstance(value, dt.datetime):
                        value = value.replace(tzinfo=None)
                    values.append(json.dumps(value, sort_keys=True, default=str))
                values.append(row.run.uid)
                if hasattr(row, "workload"):
                    values.append(f"{row.workload.name}/{row.workload.code_hash}")
                rows.append(tuple(values))
            out[model.__tablename__] = sorted(rows)
    return out


def export_text(Session, run_filter: RunFilter | None = None) -> str:
    buffer = io.StringIO()
    with Session() as s:
        export_jsonl(s, buffer, run_filter or RunFilter())
    return buffer.getvalue()


@pytest.fixture
def source(tmp_path):
    Session = open_store(f"sqlite:///{tmp_path / 'source.sqlite'}")
    populate(Session, "torch-2.11", "nightly-1")
    populate(Session, "torch-2.13", "nightly-1", n=2, status=RunStatus.CRASHED)
    return Session


def test_export_then_ingest_round_trips_row_for_row(tmp_path, source) -> None:
    text = export_text(source)
    header = json.loads(text.splitlines()[0])
    assert header["format"] == "grace-matrix-export" and header["version"] == EXPORT_VERSION
    target = open_store(f"sqlite:///{tmp_path / 'target.sqlite'}")
    with target.begin() as s:
        stats = ingest_jsonl(s, io.StringIO(text))
    assert stats.runs_added == 2 and sum(stats.rows_added.values()) == 5 * 5
    before, after = snapshot(source), snapshot(target)
    assert before["runs"] and before["pi_stage_results"]
    assert after == before
    # and the target exports to the same items (headers differ only in their time)
    assert export_text(target).splitlines()[1:] == text.splitlines()[1:]


def test_ingest_twice_changes_nothing(tmp_path, source) -> None:
    text = export_text(source)
    target = open_store(f"sqlite:///{tmp_path / 'target.sqlite'}")
    with target.begin() as s:
        ingest_jsonl(s, io.StringIO(text))
    first = snapshot(target)
    with target.begin() as s:
        stats = ingest_jsonl(s, io.StringIO(text))
    assert stats.runs_added == 0 and stats.runs_present == 2 and not stats.rows_added
    assert sum(stats.rows_present.values()) == 25
    assert snapshot(target) == first


def test_malformed_line_rolls_back_the_whole_ingest(tmp_path, source) -> None:
    lines = export_text(source).splitlines()
    broken = [*lines[:-3], lines[-3].replace('"record_key"', '"recordkey"'), *lines[-2:]]
    target = open_store(f"sqlite:///{tmp_path / 'target.sqlite'}")
    where = rf"export\.jsonl:{len(lines) - 2}: unknown field 'recordkey'"
    with pytest.raises(TransferError, match=where), target.begin() as s:
        ingest_jsonl(s, io.StringIO("\n".join(broken)), "export.jsonl")
    with target() as s:
        assert s.scalars(select(Run)).all() == []  # nothing half-written


@pytest.mark.parametrize(
    ("first_line", "problem"),
    [
        ('{"format": "grace-matrix-export", "version": 99}', "newer than this grace-matrix reads"),
        ('{"format": "something-else", "version": 1}', "not a grace-matrix export"),
        ("not json", "not a JSON line"),
    ],
)
def test_header_is_checked(tmp_path, first_line, problem) -> None:
    target = open_store(f"sqlite:///{tmp_path / 'target.sqlite'}")
    with pytest.raises(TransferError, match=problem), target.begin() as s:
        ingest_jsonl(s, io.StringIO(first_line + "\n"), "x.jsonl")


def test_rows_must_follow_their_run(tmp_path, source) -> None:
    lines = export_text(source).splitlines()
    without_runs = [line for line in lines if '"type":"run"' not in line]
    target = open_store(f"sqlite:///{tmp_path / 'target.sqlite'}")
    with pytest.raises(TransferError, match="which no earlier run line declares"), target.begin() as s:
        ingest_jsonl(s, io.StringIO("\n".join(without_runs)))


def test_export_filters(source) -> None:
    text = export_text(source, RunFilter(cells=["torch-2.13"]))
    runs = [json.loads(line) for line in text.splitlines() if '"type":"run"' in line]
    assert [r["cell"]["cell_id"] for r in runs] == ["torch-2.13"]
    assert export_text(source, RunFilter(labels=["nope"])).count("\n") == 1  # header only


def test_merge_stores_and_finish_a_running_copy(tmp_path) -> None:
    a = open_store(f"sqlite:///{tmp_path / 'a.sqlite'}")
    b = open_store(f"sqlite:///{tmp_path / 'b.sqlite'}")
    populate(a, "torch-2.4", "n1")
    uid = populate(b, "torch-2.15", "n1", status=RunStatus.RUNNING)
    target_url = f"sqlite:///{tmp_path / 'merged.sqlite'}"
    target = open_store(target_url)
    urls = [f"sqlite:///{tmp_path / 'a.sqlite'}", f"sqlite:///{tmp_path / 'b.sqlite'}"]
    stats = merge_stores(target, urls)
    assert stats.runs_added == 2 and sum(stats.rows_added.values()) == 30
    # b's run finishes later; merging again brings the final status and nothing else
    with b.begin() as s:
        finish_run(s, s.scalars(select(Run).where(Run.uid == uid)).one(), RunStatus.COMPLETE, exit_code=0)
    stats = merge_stores(target, urls)
    assert stats.runs_added == 0 and stats.runs_updated == 1 and not stats.rows_added
    with target() as s:
        statuses = sorted(s.scalars(select(Run.status)).all())
        assert statuses == ["complete", "complete"]
    merged = snapshot(target)
    assert len(merged["runs"]) == 2 and len(merged["diagnostics"]) == 6
