"""The results store on PostgreSQL: migrations, concurrent writers, and faithful transfer to and from SQLite.

Needs a server: ``GRACE_MATRIX_TEST_PG_URL`` (``.ci/postgres.sh start DIR`` starts one and prints it).
Every test works in a database of its own, created and dropped around it.
"""

from __future__ import annotations

import datetime as dt
import io
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, inspect, select, text
from store_content import environment, fresh_database, pg_base_url, store_content

from matrix.fingerprint import Environment
from matrix.store.access import finish_run, get_or_create_cell, get_or_create_workload, start_run
from matrix.store.db import SCHEMA_VERSION, open_store
from matrix.store.models import (
    Base,
    Cell,
    CorrectnessResult,
    PerformanceResult,
    PIStageResult,
    Run,
    RunStatus,
)
from matrix.store.models import TestOutcome as Outcome
from matrix.transfer import export_jsonl, ingest_jsonl

pytestmark = pytest.mark.postgres
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def pg() -> Iterator[str]:
    with fresh_database(pg_base_url()) as url:
        yield url


def _environment(cell_id: str = "torch-2.11") -> Environment:
    return environment(cell_id, extra={"numpy": "2.4.6", "nested": {"list": [1, 2.5, None, "ü"]}})


def _populate(url: str, label: str, n: int = 5, cell_id: str = "torch-2.11") -> str:
    """One finished run with ``n`` rows of outcomes, correctness, performance and PI stages."""
    Session = open_store(url)
    with Session.begin() as s:
        run = start_run(
            s, get_or_create_cell(s, _environment(cell_id)), label=label, git_sha="abc", command="t"
        )
        for i in range(n):
            node = f"suites/test_x.py::test_{i}"
            wl = get_or_create_workload(s, f"model{i % 2}", "h", "smoke", ["pi"])
            s.add(Outcome(run=run, record_key=node, nodeid=node, outcome="passed", duration_s=0.1 * i))
            s.add(
                CorrectnessResult(
                    run=run,
                    record_key=f"{node}#0",
                    nodeid=node,
                    workload_pk=wl.id,
                    mode="grace",
                    status="pass",
                    errors={"max_abs": 1e-7 * i, "tiny": 5e-324},
                    tolerance={"atol": 1e-4},
                    details={"i": i},
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
                    samples_ms=[0.1 + i / 3, 1e300, 2.0],
                    median_ms=1 / 3,
                    peak_mem_bytes=2**62 + i,
                )
            )
            s.add(
                PIStageResult(
                    run=run,
                    record_key=f"{node}#2",
                    nodeid=node,
                    subject=f"k{i}",
                    stage="rewrite",
                    status="pass",
                    message='naïve ✓ "quoted" <b>',
                    triton_version="3.6.0",
                )
            )
        finish_run(s, run, RunStatus.COMPLETE, exit_code=0, message="done")
        uid = run.uid
    Session.kw["bind"].dispose()
    return uid


def _export(url: str) -> str:
    Session = open_store(url)
    out = io.StringIO()
    with Session() as s:
        export_jsonl(s, out)
    Session.kw["bind"].dispose()
    return out.getvalue()


def _ingest(url: str, export: str) -> None:
    Session = open_store(url)
    with Session.begin() as s:
        ingest_jsonl(s, export.splitlines(keepends=True), "export")
    Session.kw["bind"].dispose()


def test_concurrent_openers_migrate_a_new_database_once(pg: str) -> None:
    code = "import sys; from matrix.store.db import open_store; open_store(sys.argv[1])"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, pg], cwd=REPO, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    Session = open_store(pg)
    with Session() as s:
        assert s.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [SCHEMA_VERSION]
        assert set(Base.metadata.tables) <= set(inspect(s.get_bind()).get_table_names())
    Session.kw["bind"].dispose()


def test_racing_writers_create_one_cell_row(pg: str) -> None:
    """Eight sessions create the same cell at once: one row, and every session gets it."""
    Session = open_store(pg)
    barrier = threading.Barrier(8)
    ids: list[int] = []
    errors: list[BaseException] = []

    def create() -> None:
        try:
            with Session.begin() as s:
                barrier.wait(timeout=30)
                cell = get_or_create_cell(s, _environment())
                start_run(s, cell, label="race")
                ids.append(cell.id)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    with Session() as s:
        assert s.scalar(select(func.count()).select_from(Cell)) == 1
        assert s.scalar(select(func.count()).select_from(Run)) == 8
    assert len(set(ids)) == 1
    Session.kw["bind"].dispose()


def test_postgres_and_sqlite_hold_the_same_rows_after_transfer(pg: str, tmp_path: Path) -> None:
    """PostgreSQL -> export -> SQLite and back: every field equal (floats, 64-bit ints, JSON, text, times)."""
    _populate(pg, "from-pg")
    sqlite = f"sqlite:///{tmp_path / 'copy.sqlite'}"
    _ingest(sqlite, _export(pg))
    assert store_content(sqlite) == store_content(pg)

    _populate(sqlite, "from-sqlite", cell_id="triton-3.6")
    _ingest(pg, _export(sqlite))
    assert store_content(pg) == store_content(sqlite)
    assert {k[0] for k in store_content(pg)} >= {"run", "cell", "performance_results", "pi_stage_results"}


def test_sqlite_times_land_in_postgres_as_utc_whatever_the_session_time_zone(pg: str, tmp_path: Path) -> None:
    sqlite = f"sqlite:///{tmp_path / 'copy.sqlite'}"
    _populate(sqlite, "tz")
    tokyo = pg + ("&" if "?" in pg else "?") + "options=-c%20TimeZone%3DAsia/Tokyo"
    _ingest(tokyo, _export(sqlite))
    Session = open_store(pg)
    with Session() as s:
        in_postgres = s.scalars(select(Run.started_at)).one()
    Session.kw["bind"].dispose()
    Source = open_store(sqlite)
    with Source() as s:
        in_sqlite = s.scalars(select(Run.started_at)).one().replace(tzinfo=dt.timezone.utc)
    Source.kw["bind"].dispose()
    assert in_postgres == in_sqlite


def test_concurrent_ingests_of_the_same_cell(pg: str, tmp_path: Path) -> None:
    exports = []
    for i in range(2):
        source = f"sqlite:///{tmp_path / f'{i}.sqlite'}"
        _populate(source, f"night-{i}")
        exports.append(_export(source))
    Session = open_store(pg)
    first = Session()
    first.begin()
    ingest_jsonl(first, exports[0].splitlines(keepends=True), "first")  # holds the new cell row, uncommitted
    errors: list[BaseException] = []

    def second() -> None:
        try:
            with Session.begin() as s:
                ingest_jsonl(s, exports[1].splitlines(keepends=True), "second")
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=second)
    thread.start()
    thread.join(timeout=2)  # the second ingest now waits on the first's cell row
    first.commit()
    first.close()
    thread.join(timeout=60)
    with Session() as s:
        runs = s.scalar(select(func.count()).select_from(Run))
    Session.kw["bind"].dispose()
    assert not errors and runs == 2, errors
