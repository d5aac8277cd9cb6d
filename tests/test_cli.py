"""The grace-matrix command line end to end: cells (and nox -l), run, summary, export/ingest/merge, errors."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from matrix.store.db import open_store
from matrix_cli.main import main

ROOT = Path(__file__).resolve().parent.parent

PROJECT_MATRIX = """
format = 1
default_tag = "here"

[[cells]]
id = "current"
kind = "current"
tags = ["here"]
paths = ["checks"]
"""

CHECKS = """
import os, signal
import pytest
from suites.records import USER_PROPERTY_KEY, PIStage, PIStageRecord, StageStatus

@pytest.mark.parametrize("i", range(6))
def test_stage(request, i):
    record = PIStageRecord(f"kernel{i}", PIStage.ASSEMBLE, StageStatus.PASS, message="assembled")
    request.node.user_properties.append((USER_PROPERTY_KEY, record.to_property()))
    assert i != 5

def test_skipped():
    pytest.skip("no GPU here")

def test_zz_maybe_die():
    if os.environ.get("DIE"):
        os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project root with its own matrix.toml and a small suite; the store in tmp_path."""
    (tmp_path / "matrix.toml").write_text(PROJECT_MATRIX)
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "test_checks.py").write_text(textwrap.dedent(CHECKS))
    monkeypatch.setenv("GRACE_MATRIX_DB", f"sqlite:///{tmp_path / 'store.sqlite'}")
    monkeypatch.delenv("GRACE_MATRIX_LABEL", raising=False)
    monkeypatch.delenv("DIE", raising=False)
    return tmp_path


def run_json(capsys, argv: list[str]) -> tuple[int, object]:
    capsys.readouterr()
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def test_cells_json_lists_every_kind(capsys) -> None:
    code, cells = run_json(capsys, ["cells", "--config", str(ROOT / "matrix.toml")])
    assert code == 0
    venv = [c for c in cells if c["kind"] == "venv" and "canary" not in c["tags"]]
    assert len(venv) >= 12
    assert {tuple(c["torch"].split(".")[:2]) for c in venv} == {("2", str(m)) for m in range(4, 16)}
    assert all(c["triton"] for c in venv)
    assert [c for c in cells if "canary" in c["tags"]]
    assert len([c for c in cells if c["kind"] == "triton-only"]) == 10
    assert [c["id"] for c in cells if c["kind"] == "current"] == ["current", "current-multi-gpu"]
    code, quick = run_json(capsys, ["cells", "--config", str(ROOT / "matrix.toml"), "--tag", "quick"])
    assert [c["id"] for c in quick] == ["torch-2.13", "triton-3.7"]


@pytest.mark.skipif(importlib.util.find_spec("nox") is None, reason="nox is not installed")
def test_nox_lists_the_same_cells(capsys) -> None:
    listing = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "-f", str(ROOT / "noxfile.py")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    # "* cell(torch-2.13) [nightly,quick] -> description" ("-" instead of "*": not selected by default)
    listed = {}
    for line in listing.stdout.splitlines():
        if match := re.match(r"^[*-] (\S+)(?: \[([^\]]*)\])?", line):
            listed[match[1]] = sorted(filter(None, (match[2] or "").split(",")))
    _, cells = run_json(capsys, ["cells", "--config", str(ROOT / "matrix.toml")])
    assert sorted(k for k in listed if k.startswith("cell(")) == sorted(f"cell({c['id']})" for c in cells)
    for c in cells:
        assert listed[f"cell({c['id']})"] == sorted(c["tags"])
    assert {"matrix", "tests", "lint", "summary", "dashboard"} <= set(listed)


@pytest.mark.slow
def test_current_cell_runs_end_to_end_and_summary_shows_it(project, capsys) -> None:
    config = str(project / "matrix.toml")
    code, result = run_json(
        capsys, ["run", "--config", config, "--cell", "current", "-n", "2", "--label", "t1"]
    )
    assert code == 0 and result["status"] == "complete" and result["exit_code"] == 1  # one test failed
    code, runs = run_json(capsys, ["summary"])
    assert code == 0
    (run,) = runs
    assert run["uid"] == result["uid"] and run["cell_id"] == "current" and run["label"] == "t1"
    assert run["outcomes"] == {"passed": 6, "failed": 1, "skipped": 1}
    assert run["records"] == {"pi_stage": 6}
    capsys.readouterr()
    assert main(["summary"]) == 0
    table = capsys.readouterr().out
    assert "current" in table and "complete" in table


@pytest.mark.slow
def test_run_marks_a_killed_child_crashed_and_keeps_its_rows(project, capsys, monkeypatch) -> None:
    monkeypatch.setenv("DIE", "1")
    config = str(project / "matrix.toml")
    code, result = run_json(capsys, ["run", "--config", config, "--cell", "current", "-n", "0"])
    assert code == 1
    assert result["status"] == "crashed" and "SIGKILL" in result["message"]
    _, (run,) = run_json(capsys, ["summary"])
    assert run["status"] == "crashed"
    assert run["records"] == {"pi_stage": 6}
    assert run["outcomes"] == {"passed": 5, "failed": 1, "skipped": 1}  # the killed test never reported


def test_install_failure_is_recorded(project, capsys) -> None:
    config = str(project / "matrix.toml")
    message = project / "pip.txt"
    message.write_text("ERROR: No matching distribution found for torch==2.15.0\n")
    code, result = run_json(capsys, ["run", "--config", config, "--install-failed", f"@{message}"])
    assert code == 0 and result["status"] == "install_failed"
    _, (run,) = run_json(capsys, ["summary"])
    assert run["status"] == "install_failed" and "No matching distribution" in run["message"]


def test_export_ingest_and_merge_through_the_cli(project, capsys) -> None:
    config = str(project / "matrix.toml")
    for n in range(2):
        main(["run", "--config", config, "--install-failed", f"attempt {n}", "--label", f"l{n}"])
    export = project / "export.jsonl"
    assert main(["export", "-o", str(export)]) == 0
    assert len(export.read_text().splitlines()) == 3  # header + 2 runs
    other = f"sqlite:///{project / 'other.sqlite'}"
    code, stats = run_json(capsys, ["ingest", str(export), "--db", other])
    assert code == 0 and stats[str(export)]["runs_added"] == 2
    code, stats = run_json(capsys, ["ingest", str(export), "--db", other])
    assert stats[str(export)]["runs_present"] == 2
    merged = f"sqlite:///{project / 'merged.sqlite'}"
    code, stats = run_json(capsys, ["merge", str(project / "store.sqlite"), other, "--db", merged])
    assert code == 0 and stats["runs_added"] == 2 and stats["runs_present"] == 2
    _, runs = run_json(capsys, ["summary", "--db", merged, "--all"])
    assert sorted(r["label"] for r in runs) == ["l0", "l1"]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("grace-matrix: error: ")
    return err[0]


def test_errors_are_one_line_with_exit_codes(project, capsys) -> None:
    config = str(project / "matrix.toml")
    capsys.readouterr()
    assert main(["run", "--config", config, "--cell", "torch-9"]) == 2
    assert "no cell 'torch-9'" in one_error_line(capsys)

    (project / "bad.toml").write_text(PROJECT_MATRIX.replace('kind = "current"', 'kind = "currant"'))
    assert main(["cells", "--config", str(project / "bad.toml")]) == 2
    assert "cells[0].kind: 'currant' is not one of" in one_error_line(capsys)

    corrupt = project / "corrupt.sqlite"
    corrupt.write_bytes(b"definitely not sqlite" * 200)
    assert main(["summary", "--db", f"sqlite:///{corrupt}"]) == 2
    assert "not a readable SQLite database" in one_error_line(capsys)

    for args in (["summary"], ["ingest", str(project / "absent.jsonl")]):  # a folder named as the store
        assert main([*args, "--db", f"sqlite:///{project}"]) == 2
        assert f"store {project} is a folder, not a SQLite file" in one_error_line(capsys)

    junk = project / "junk.jsonl"
    junk.write_text('{"format": "grace-matrix-export", "version": 1}\n{"type": "run"}\n')
    assert main(["ingest", str(junk)]) == 2
    assert "junk.jsonl:2: run line lacks its 'cell' object" in one_error_line(capsys)

    assert main(["ingest", str(project / "absent.jsonl")]) == 2
    assert "cannot read" in one_error_line(capsys)


def test_a_bug_exits_3_with_its_traceback_not_1(monkeypatch, capsys) -> None:
    """Exit 1 means "regression found" to the nightly and CI; a crash must never read as one."""
    import matrix_cli.commands.summary as summary

    def crash(args):
        raise KeyError("planted")

    real_register = summary.register

    def register(subparsers):
        real_register(subparsers)
        subparsers.choices["summary"].set_defaults(handler=crash)

    monkeypatch.setattr(summary, "register", register)
    assert main(["summary"]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError: 'planted'" in err
    assert "internal error in `summary`" in err


def test_usage_errors_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["cells", "--no-such-option"])
    assert info.value.code == 2
    assert main([]) == 2


def test_export_to_a_device_writes_through(project, capsys, tmp_path) -> None:
    fifo = tmp_path / "pipe"
    import os
    import threading

    os.mkfifo(fifo)
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.append(fifo.read_text()))
    reader.start()
    open_store().kw["bind"].dispose()  # export reads a store, never creates one: create it empty
    assert main(["export", "-o", str(fifo)]) == 0
    reader.join(timeout=30)
    assert fifo.exists() and not fifo.is_file()  # still a pipe, not replaced by a regular file
    assert chunks and chunks[0].startswith('{"exported_at"')


def test_ctrl_c_before_the_command_runs_is_one_line(monkeypatch, capsys) -> None:
    """Interrupted while the parser is built (its commands' imports take about a second): the same one
    line and status 130 as an interrupted command, no traceback."""
    import matrix_cli.main as cli

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert main(["summary"]) == 130
    assert capsys.readouterr().err == "grace-matrix: interrupted\n"
