"""``grace-matrix nightly``: cells as separate processes, one store, per-cell exports merged.

The integration tests run synthetic cells (tests/synthetic_cells.py) as separate ``grace-matrix run``
processes, several at once, and count every row against what each cell says it produced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import io
import json
import os
from pathlib import Path

import pytest
from sqlalchemy import select
from store_content import by_cell, fresh_database, pg_base_url, store_content
from synthetic_cells import SyntheticCell, expected_keys, write_project

from matrix.cells import Exclusion, load_matrix
from matrix.nightly import (
    NightlyOptions,
    StoreMode,
    Via,
    _Children,
    cell_command,
    cell_store_url,
    child_env,
    default_label,
    default_mode,
    run_one_cell,
    run_report_steps,
    select_cells,
)
from matrix.store.access import process_alive
from matrix.store.db import open_store
from matrix.store.models import RESULT_TABLES, Run
from matrix_cli.main import main

REPO = Path(__file__).resolve().parents[1]
RECORD_TABLES = [m.__tablename__ for m in RESULT_TABLES if m.__tablename__ != "test_outcomes"]


@pytest.fixture
def child_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cell processes import grace-matrix from this checkout, installed or not."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def _options(tmp_path: Path, config: Path, **kw: object) -> NightlyOptions:
    matrix = load_matrix(config)
    values: dict[str, object] = {
        "cells": matrix.cells,
        "label": "nightly-test",
        "target_url": f"sqlite:///{tmp_path / 'target.sqlite'}",
        "mode": StoreMode.PER_CELL,
        "via": Via.RUN,
        "jobs": 2,
        "workdir": tmp_path / "nightly-work",
        "config_path": config,
    }
    values.update(kw)
    return NightlyOptions(**values)  # type: ignore[arg-type]


def _nightly(config: Path | str, db: str, workdir: Path, label: str, *extra: str) -> tuple[int, dict]:
    out = workdir.parent / f"{label}.json"
    argv = ["nightly", "--config", str(config), "--db", db, "--workdir", str(workdir), "--label", label]
    argv += ["--via", "run", "-j", "3", "-n", "0", "--json", *extra]
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(argv)
    out.write_text(buffer.getvalue(), encoding="utf-8")
    return code, json.loads(buffer.getvalue())


def _why(report: dict) -> str:
    """The report and what each report step printed: the message of a failed assertion on a nightly."""
    parts = [json.dumps(report, indent=1, default=str)]
    for step in report.get("steps", []):
        output = step.get("output")
        if output and Path(output).is_file():
            head = f"--- {step.get('name')} (exit {step.get('exit_code')}):"
            parts.append(f"{head}\n{Path(output).read_text()}")
    return "\n".join(parts)


def _rows_by_cell(url: str, label: str) -> dict[str, dict[str, set[str]]]:
    """cell id -> table -> record keys, for the runs with ``label``."""
    content = store_content(url, labels=[label])
    cell_of = {key[1]: fields["cell_id"] for key, fields in content.items() if key[0] == "cell"}
    out: dict[str, dict[str, set[str]]] = {}
    for key in content:
        if key[0] in ("run", "cell"):
            continue
        table, uid, record_key = key
        tables = out.setdefault(cell_of[uid], {})
        group = "test_outcomes" if table == "test_outcomes" else "records"
        tables.setdefault(group, set()).add(record_key)
    return out


# -- units ---------------------------------------------------------------------------------------------


def test_default_mode_follows_the_target_store() -> None:
    assert default_mode("sqlite:////x/store.sqlite") is StoreMode.PER_CELL
    assert default_mode("postgresql+psycopg://u@127.0.0.1:5432/db") is StoreMode.SHARED


def test_default_label_is_dated() -> None:
    when = dt.datetime(2026, 11, 29, 3, 17, 5, tzinfo=dt.timezone.utc)
    assert default_label(when) == "nightly-2026-11-29-031705"


def test_cell_commands_and_environment(tmp_path: Path) -> None:
    config = write_project(tmp_path, [SyntheticCell("syn-a", 1, 1)])
    cell = load_matrix(config).cell("syn-a")
    nox = _options(tmp_path, config, via=Via.NOX, pytest_args=("-x",))
    argv = cell_command(nox, cell)
    assert argv[1:3] == ["-m", "nox"] and argv[-4:] == ["-s", "cell(syn-a)", "--", "-x"]
    run = _options(tmp_path, config)
    assert cell_command(run, cell)[1:6] == ["-m", "matrix_cli", "run", "--cell", "syn-a"]
    per_cell = cell_store_url(run, cell)
    assert per_cell.endswith("/nightly-work/stores/syn-a.sqlite")
    shared = _options(tmp_path, config, mode=StoreMode.SHARED, target_url="postgresql+psycopg://h/db")
    assert cell_store_url(shared, cell) == "postgresql+psycopg://h/db"
    env = child_env(run, cell, per_cell)
    assert env["GRACE_MATRIX_DB"] == per_cell
    assert env["GRACE_MATRIX_LABEL"] == "nightly-test" and env["GRACE_MATRIX_CELL"] == "syn-a"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)


def test_cell_selection_passes_over_excluded_cells_only_when_building_them() -> None:
    matrix = load_matrix(REPO / "matrix.toml")
    everything, _ = select_cells(matrix, [], [], Via.RUN)
    assert [c.id for c in everything] == list(matrix.ids)  # every cell carries the nightly tag
    picked, _ = select_cells(matrix, ["current", "triton-3.7"], [], Via.NOX)
    assert [c.id for c in picked] == ["triton-3.7", "current"]  # file order
    with_all_excluded = dataclasses.replace(matrix, exclusions=(Exclusion("torch-*", "no torch here"),))
    runnable, passed_over = select_cells(with_all_excluded, [], ["canary"], Via.NOX)
    assert runnable == () and {c for c, _ in passed_over} == {
        "torch-2.13-triton-3.9",
        "torch-2.11-triton-3.8",
    }
    runnable, passed_over = select_cells(with_all_excluded, [], ["canary"], Via.RUN)
    assert len(runnable) == 2 and passed_over == ()


def test_nox_needs_a_noxfile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_project(tmp_path, [SyntheticCell("syn-a", 1, 1)])
    assert main(["nightly", "--config", str(config), "--db", f"sqlite:///{tmp_path}/s.sqlite"]) == 2
    assert "no noxfile.py" in capsys.readouterr().err


def test_a_cell_past_its_timeout_is_ended_with_its_children(tmp_path: Path, child_pythonpath: None) -> None:
    config = write_project(tmp_path, [SyntheticCell("syn-hang", 3, 1, hang_at=1)])
    options = _options(tmp_path, config, timeout_s=30.0, workers="0")
    for sub in ("logs", "stores", "exports"):
        (options.workdir / sub).mkdir(parents=True)
    outcome = run_one_cell(options, load_matrix(config).cell("syn-hang"), _Children())
    assert outcome.timed_out and not outcome.ok
    (run,) = outcome.runs
    # The cell's run settles its run (crashed) as it is ended; the test before the hang is kept.
    assert run.status in ("running", "crashed") and run.rows["test_outcomes"] == 1
    Session = open_store(cell_store_url(options, load_matrix(config).cell("syn-hang")))
    with Session() as session:
        pid = session.scalars(select(Run.pid)).one()
    Session.kw["bind"].dispose()
    assert pid is not None and not process_alive(pid), "the pytest grandchild was ended too"


def test_report_steps_are_typed_calls_on_the_target_store(tmp_path: Path) -> None:
    """The regressions step judges the label in this process and writes what ``regressions`` prints; the
    dashboard step calls the ``publish`` function it is given (none: skipped, a failure: exit 1)."""
    config = write_project(tmp_path, [SyntheticCell("syn-a", 1, 1)])
    options = _options(tmp_path, config)
    options.workdir.mkdir()
    open_store(options.target_url).kw["bind"].dispose()  # run_nightly creates the target first
    seen: list[Path] = []

    def publish(session: object, thresholds: object, out: Path) -> str:
        seen.append(out)
        return "rendered"

    regressions, dashboard = run_report_steps(options, publish)
    assert regressions.name == "regressions" and regressions.exit_code == 1  # the label has no run
    assert "nightly-test" in regressions.output.read_text()
    assert (dashboard.exit_code, dashboard.output.read_text()) == (0, "rendered\n")
    assert seen == [options.workdir / "site"]
    (_, skipped) = run_report_steps(options, None)
    assert skipped.exit_code is None and "no dashboard renderer" in (skipped.skipped or "")

    def broken(session: object, thresholds: object, out: Path) -> str:
        raise RuntimeError("template missing")

    (_, failed) = run_report_steps(options, broken)
    assert failed.exit_code == 1 and "RuntimeError: template missing" in failed.output.read_text()


# -- per-cell SQLite stores, exported and merged -------------------------------------------------------


def test_per_cell_stores_merge_exactly_and_a_crashed_cell_keeps_its_rows(
    tmp_path: Path, child_pythonpath: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cells = [
        SyntheticCell("syn-a", 12, 2),
        SyntheticCell("syn-b", 9, 3),
        SyntheticCell("syn-c", 10, 1, crash_at=6),
    ]
    config = write_project(tmp_path, cells)
    target = f"sqlite:///{tmp_path / 'target.sqlite'}"
    monkeypatch.chdir(tmp_path.parent)  # a --config relative to here, not to the cells' directory
    relative = Path(tmp_path.name) / config.name
    code, report = _nightly(relative, target, tmp_path / "nightly-work", "nightly-sqlite", "--no-report")

    assert code == 1, "a crashed cell fails the nightly"
    outcome = {c["cell_id"]: c for c in report["cells"]}
    assert [outcome[c.id]["ok"] for c in cells] == [True, True, False]
    assert [r["status"] for r in outcome["syn-c"]["runs"]] == ["crashed"]

    stored = _rows_by_cell(target, "nightly-sqlite")
    for cell in cells:
        expected = expected_keys(tmp_path, cell)
        assert stored[cell.id] == expected, cell.id
        # what the cell process reported reading back from its own store agrees with the merged store
        (run,) = outcome[cell.id]["runs"]
        assert run["rows"]["test_outcomes"] == len(expected["test_outcomes"])
        assert sum(run["rows"][t] for t in RECORD_TABLES) == len(expected["records"])
    assert len(stored["syn-c"]["test_outcomes"]) == 6, "the six tests before the crash are kept"

    # Merging is the union of the per-cell exports, row for row; ingesting them again adds nothing.
    per_cell = {}
    for cell in cells:
        per_cell.update(
            store_content(f"sqlite:///{tmp_path / 'nightly-work' / 'stores' / f'{cell.id}.sqlite'}")
        )
    assert store_content(target) == per_cell
    exports = sorted((tmp_path / "nightly-work" / "exports").glob("*.jsonl"))
    assert [p.stem for p in exports] == ["syn-a", "syn-b", "syn-c"]
    assert main(["ingest", "--db", target, *map(str, exports)]) == 0
    assert store_content(target) == per_cell


# -- PostgreSQL: cells writing into one server at once -------------------------------------------------


@pytest.mark.postgres
def test_cells_write_postgres_at_once_and_match_the_merged_sqlite_exports(
    tmp_path: Path, child_pythonpath: None
) -> None:
    cells = [
        SyntheticCell("syn-a", 40, 3, meet=3),
        SyntheticCell("syn-b", 30, 2, meet=3),
        SyntheticCell("syn-c", 35, 4, meet=3),
    ]
    config = write_project(tmp_path, cells)
    with fresh_database(pg_base_url()) as pg:
        # 1. shared: three cell processes record straight into PostgreSQL, concurrently.
        code, report = _nightly(config, pg, tmp_path / "shared", "nightly-shared", "--no-report")
        assert code == 0, report
        assert report["mode"] == "shared"
        stored = _rows_by_cell(pg, "nightly-shared")
        for cell in cells:
            assert stored[cell.id] == expected_keys(tmp_path, cell), cell.id
        Session = open_store(pg)
        with Session() as session:
            runs = session.scalars(select(Run).where(Run.label == "nightly-shared")).all()
        Session.kw["bind"].dispose()
        assert len(runs) == 3 and {r.status for r in runs} == {"complete"}
        assert max(r.started_at for r in runs) < min(r.finished_at for r in runs), "the cells overlapped"

        # 2. per-cell: the same cells through SQLite stores, exported and ingested into PostgreSQL.
        for cell in cells:
            (tmp_path / cell.directory / "produced.txt").unlink()
        code, report = _nightly(
            config, pg, tmp_path / "per-cell", "nightly-per-cell", "--store-mode", "per-cell"
        )
        assert code == 0, _why(report)
        stores = [str(tmp_path / "per-cell" / "stores" / f"{c.id}.sqlite") for c in cells]
        merged = f"sqlite:///{tmp_path / 'merged.sqlite'}"
        assert main(["merge", "--db", merged, *stores]) == 0

        in_postgres = store_content(pg, labels=["nightly-per-cell"])
        in_sqlite = store_content(merged)
        assert len(in_postgres) == 3 * 2 + sum(c.tests * (1 + c.records) for c in cells)
        assert in_postgres == in_sqlite  # keyed on run uid and record key, every field but integer ids

        # 3. both ways give the same results for the same cells (times, pids and durations aside).
        volatile = ("started_at", "finished_at", "recorded_at", "pid", "command", "duration_s", "worker")
        shared = by_cell(store_content(pg, labels=["nightly-shared"], drop=volatile))
        per_cell = by_cell(store_content(pg, labels=["nightly-per-cell"], drop=volatile))
        assert shared == per_cell


# -- regressions and dashboard ------------------------------------------------------------------------


def test_a_slower_night_fails_with_new_regressions_and_renders_the_site(
    tmp_path: Path, child_pythonpath: None
) -> None:
    target = f"sqlite:///{tmp_path / 'history.sqlite'}"
    config = write_project(tmp_path, [SyntheticCell("syn-a", 8, 1)])
    code, report = _nightly(config, target, tmp_path / "night-1", "night-1")
    assert code == 0, _why(report)
    assert [s["exit_code"] for s in report["steps"]] == [0, 0]
    write_project(tmp_path, [SyntheticCell("syn-a", 8, 1, scale=3.0)])  # every timing three times slower
    code, report = _nightly(config, target, tmp_path / "night-2", "night-2")
    assert code == 1 and report["new_regressions"], report
    assert "NEW" in (tmp_path / "night-2" / "regressions.txt").read_text()
    assert (tmp_path / "night-2" / "site" / "index.html").is_file()
