"""``grace-matrix pi-status``: rows of the latest run per cell, summaries per stage, exit status."""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path

import pytest

from matrix.store.db import open_store
from matrix.store.models import Cell, PIStageResult, Run
from matrix_cli.commands import COMMAND_MODULES, pi_status


def _cell(session, cell_id: str, triton: str) -> Cell:  # type: ignore[no-untyped-def]
    cell = Cell(
        fingerprint=uuid.uuid4().hex,
        cell_id=cell_id,
        kind="triton-only",
        torch_version=None,
        triton_version=triton,
        python_version="3.11",
        platform="linux",
    )
    session.add(cell)
    session.flush()
    return cell


def _run(session, cell: Cell, results: list[tuple[str, str, str, str]]) -> Run:  # type: ignore[no-untyped-def]
    run = Run(uid=str(uuid.uuid4()), cell_pk=cell.id, status="complete")
    session.add(run)
    session.flush()
    for i, (subject, stage, status, message) in enumerate(results):
        session.add(
            PIStageResult(
                run_pk=run.id,
                record_key=f"suites/test_pi_stages.py::t#{i}",
                nodeid="suites/test_pi_stages.py::t",
                subject=subject,
                stage=stage,
                status=status,
                message=message,
                triton_version=cell.triton_version,
            )
        )
    return run


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    Session = open_store(url)
    with Session.begin() as session:
        old = _cell(session, "triton-3.0", "3.0.0")
        _run(session, old, [("k", "rewrite", "fail", "stale run, superseded")])
        _run(
            session,
            old,
            [
                ("k", "assemble", "pass", "ptxas 12.4"),
                ("k", "locate", "pass", "ok"),
                ("k", "rewrite", "pass", "2 loads"),
                ("k", "load", "skip", "no CUDA device"),
            ],
        )
        new = _cell(session, "triton-3.9", "3.9.0")
        _run(
            session,
            new,
            [
                ("k", "locate", "pass", "ok"),
                ("k", "rewrite", "fail", "unknown_param_use: parameter 0"),
                ("k", "assemble", "skip", "rewrite refused"),
                ("j", "rewrite", "pass", "1 load"),
            ],
        )
    return url


def test_latest_run_per_cell_in_stage_order(store: str) -> None:
    with open_store(store).begin() as session:
        rows = pi_status.load_rows(session)
    by_cell = {}
    for row in rows:
        by_cell.setdefault(row.cell, []).append((row.subject, row.stage, row.status))
    assert by_cell["triton-3.0"] == [
        ("k", "locate", "pass"),
        ("k", "rewrite", "pass"),
        ("k", "assemble", "pass"),
        ("k", "load", "skip"),
    ]
    assert ("k", "rewrite", "fail") in by_cell["triton-3.9"]


def test_summary_counts_and_first_failure(store: str) -> None:
    with open_store(store).begin() as session:
        summary = pi_status.summarize(pi_status.load_rows(session, cells=["triton-3.9"]))
    rewrite = next(s for s in summary if s["stage"] == "rewrite")
    assert (rewrite["pass"], rewrite["fail"], rewrite["skip"]) == (1, 1, 0)
    assert rewrite["first_failure"] == "k: unknown_param_use: parameter 0"
    assert [s["stage"] for s in summary] == ["locate", "rewrite", "assemble"]


def test_filters(store: str) -> None:
    with open_store(store).begin() as session:
        failed = pi_status.load_rows(session, failed_only=True)
        assembles = pi_status.load_rows(session, stages=["assemble"])
    assert [(r.cell, r.stage) for r in failed] == [("triton-3.9", "rewrite")]
    assert {r.cell for r in assembles} == {"triton-3.0", "triton-3.9"}


def test_registered() -> None:
    assert "pi_status" in COMMAND_MODULES


def test_json_output_and_exit_status(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(db=store, run=[], cell=[], stage=[], failed=False, json=True)
    assert pi_status.handle(args) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == pi_status.FORMAT_VERSION
    assert {r["cell"] for r in data["results"]} == {"triton-3.0", "triton-3.9"}
    args = argparse.Namespace(db=store, run=[], cell=["triton-3.0"], stage=[], failed=False, json=True)
    assert pi_status.handle(args) == 0
