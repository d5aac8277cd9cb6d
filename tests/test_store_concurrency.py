"""Concurrent writers on one store: ingests of the same export and of different ones, recorder sessions.

Every writer is its own process, started at once, on a store that does not exist yet (so they also race
to create it): SQLite always, PostgreSQL where ``GRACE_MATRIX_TEST_PG_URL`` names a server. Each must
succeed, and the store must hold each row exactly once.
"""

from __future__ import annotations

import io
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from store_content import environment, fresh_database, pg_base_url

from matrix.fingerprint import Environment
from matrix.store.access import finish_run, get_or_create_cell, get_or_create_workload, start_run
from matrix.store.db import open_store
from matrix.store.models import RESULT_TABLES, Cell, CorrectnessResult, Run, RunStatus, Workload
from matrix.store.models import TestOutcome as Outcome
from matrix.transfer import export_jsonl

pytestmark = pytest.mark.slow  # eight or six processes at once
REPO = Path(__file__).resolve().parents[1]
WRITERS = 8


def _environment(cell_id: str) -> Environment:
    return environment(cell_id, platform="Linux-x86_64")


def _export(cell_ids: list[str], rows: int = 20) -> str:
    """An export of one run per cell id (sharing workloads), ``rows`` outcomes and results each."""
    Session = open_store("sqlite://")
    with Session.begin() as s:
        for cell_id in cell_ids:
            run = start_run(s, get_or_create_cell(s, _environment(cell_id)), label="l", command="t")
            for i in range(rows):
                node = f"suites/test_x.py::test_{i}"
                wl = get_or_create_workload(s, f"model{i % 3}", "h", "smoke", [])
                s.add(Outcome(run=run, record_key=node, nodeid=node, outcome="passed"))
                s.add(
                    CorrectnessResult(
                        run=run,
                        record_key=f"{node}#0",
                        nodeid=node,
                        workload_pk=wl.id,
                        mode="grace",
                        status="pass",
                    )
                )
            finish_run(s, run, RunStatus.COMPLETE, exit_code=0)
    out = io.StringIO()
    with Session() as s:
        export_jsonl(s, out)
    return out.getvalue()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _run_all(commands: list[list[str]], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    procs = [
        subprocess.Popen(
            c, cwd=cwd, env=_child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for c in commands
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    return [
        subprocess.CompletedProcess(p.args, p.returncode, out) for p, out in zip(procs, outputs, strict=True)
    ]


def _counts(url: str) -> dict[str, int]:
    Session = open_store(url)
    try:
        with Session() as s:
            models = (Run, Cell, Workload, *RESULT_TABLES)
            return {m.__tablename__: s.scalar(select(func.count()).select_from(m)) or 0 for m in models}
    finally:
        Session.kw["bind"].dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh' / 'store.sqlite'}"
        return
    with fresh_database(pg_base_url()) as url:
        yield url


def _ingest(url: str, *files: Path) -> list[str]:
    return [sys.executable, "-m", "matrix_cli", "ingest", "--db", url, *map(str, files)]


def test_concurrent_ingests_of_one_export_all_succeed_and_add_each_row_once(
    store_url: str, tmp_path: Path
) -> None:
    export = tmp_path / "one.jsonl"
    export.write_text(_export(["cell-a", "cell-b"]))
    results = _run_all([_ingest(store_url, export) for _ in range(WRITERS)], tmp_path)
    assert [r.returncode for r in results] == [0] * WRITERS, [r.stdout for r in results if r.returncode]
    assert _counts(store_url) == {
        "runs": 2,
        "cells": 2,
        "workloads": 3,
        "test_outcomes": 40,
        "correctness_results": 40,
        "performance_results": 0,
        "pi_stage_results": 0,
        "diagnostics": 0,
    }
    added = sum("2 runs added" in r.stdout for r in results)
    assert added == 1 and sum("2 already present" in r.stdout for r in results) == WRITERS - 1


def test_concurrent_ingests_of_different_exports_share_cells_and_workloads(
    store_url: str, tmp_path: Path
) -> None:
    files = []
    for i in range(WRITERS):
        path = tmp_path / f"export-{i}.jsonl"
        path.write_text(_export(["cell-a", f"cell-{i}"], rows=10))  # every file creates cell-a too
        files.append(path)
    results = _run_all([_ingest(store_url, f) for f in files], tmp_path)
    assert [r.returncode for r in results] == [0] * WRITERS, [r.stdout for r in results if r.returncode]
    counts = _counts(store_url)
    assert counts["runs"] == 2 * WRITERS and counts["cells"] == WRITERS + 1  # cell-a and cell-0..7
    assert (
        counts["workloads"] == 3 and counts["test_outcomes"] == counts["correctness_results"] == 20 * WRITERS
    )


RECORDED_TESTS = """
import pytest
from suites.records import USER_PROPERTY_KEY, PIStage, PIStageRecord, StageStatus

@pytest.mark.parametrize("i", range(5))
def test_stage(request, i):
    record = PIStageRecord(f"kernel{i}", PIStage.ASSEMBLE, StageStatus.PASS, message="assembled")
    request.node.user_properties.append((USER_PROPERTY_KEY, record.to_property()))
"""


def test_concurrent_recorder_sessions_on_one_new_store_all_record(tmp_path: Path) -> None:
    sessions = 6
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "test_checks.py").write_text(textwrap.dedent(RECORDED_TESTS))
    url = f"sqlite:///{tmp_path / 'fresh' / 'store.sqlite'}"
    command = [
        *(sys.executable, "-m", "pytest", "-p", "matrix.recorder", "-p", "no:cacheprovider", "-q", "checks"),
        *("--grace-matrix-db", url, "--grace-matrix-cell", "current", "--grace-matrix-kind", "current"),
    ]
    results = _run_all([command] * sessions, tmp_path)
    assert [r.returncode for r in results] == [0] * sessions, [
        r.stdout[-2000:] for r in results if r.returncode
    ]
    assert not any("NOT RECORDED" in r.stdout or "INTERNALERROR" in r.stdout for r in results)
    counts = _counts(url)
    assert counts["runs"] == sessions and counts["cells"] == 1
    assert counts["test_outcomes"] == counts["pi_stage_results"] == 5 * sessions
    Session = open_store(url)
    with Session() as s:
        assert set(s.scalars(select(Run.status))) == {RunStatus.COMPLETE.value}
    Session.kw["bind"].dispose()


def test_a_store_another_process_is_creating_opens_once_its_writer_is_done(tmp_path: Path) -> None:
    """SQLite switches a store to WAL mode under an exclusive lock taken without its busy handler: while
    another connection writes a store not yet in WAL mode (the first opener creating it), the switch
    fails at once with 'database is locked' (CI saw one of eight concurrent first ingests fail). Opening
    waits for the writer instead."""
    path = tmp_path / "store.sqlite"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("CREATE TABLE creating (x)")
    done = threading.Timer(0.5, lambda: writer.execute("COMMIT"))
    done.start()
    try:
        Session = open_store(f"sqlite:///{path}")
        with Session() as session:
            assert session.connection().exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        done.join()
        writer.close()
