"""Hostile input for the service, a further probe: each test is one finding.

A test outcome no writer records (``FAILED``, ``weird``, empty) that ingest took and every judge then
ignored, so the cell stayed green.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import export_run_line, one_error_line

from matrix.store.db import open_store
from matrix_cli.main import main

UID = "00000000-0000-0000-0000-0000000000bb"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "store.sqlite"
    monkeypatch.setenv("GRACE_MATRIX_DB", f"sqlite:///{path}")
    monkeypatch.chdir(tmp_path)  # no expected.toml, no matrix.toml: nothing but the store
    open_store(f"sqlite:///{path}").kw["bind"].dispose()
    return path


def _export(path: Path, run: dict[str, object] | None = None, *rows: dict[str, object]) -> Path:
    header = {"format": "grace-matrix-export", "version": 1, "schema": "0002"}
    items = [header, {**export_run_line(UID), **(run or {})}, *({"run": UID, **row} for row in rows)]
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


def _outcome(outcome: str, key: str = "suites/test_a.py::test_a") -> dict[str, object]:
    return {"type": "test_outcomes", "record_key": key, "nodeid": key, "outcome": outcome}


def _refused(store: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one error line of ``grace-matrix ARGS``, which must exit 2 and leave the store byte-identical."""
    before = store.read_bytes()
    capsys.readouterr()
    assert main(list(args)) == 2
    line = one_error_line(capsys)
    assert store.read_bytes() == before
    return line


# -- 1. a test outcome no writer records ------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["FAILED", "Failed", "weird", "xfailed", ""])
def test_an_unknown_test_outcome_is_refused_at_ingest(store, tmp_path, capsys, outcome) -> None:
    """Such an outcome used to be stored, and summary, regressions and the dashboard judged the run as if
    the test had passed (the cell green)."""
    path = _export(tmp_path / "bad.jsonl", None, _outcome("passed", "t::ok"), _outcome(outcome))
    line = _refused(store, capsys, "ingest", str(path))
    assert f"{path}:4: field 'outcome' of test_outcomes is str {json.dumps(outcome)}, not one of" in line


def test_every_written_test_outcome_is_ingested(store, tmp_path, capsys) -> None:
    outcomes = ("passed", "failed", "skipped", "error", "crashed")
    path = _export(tmp_path / "ok.jsonl", None, *(_outcome(o, f"t::{o}") for o in outcomes))
    assert main(["ingest", str(path)]) == 0
    capsys.readouterr()
    assert main(["summary", "--json"]) == 0
    (summary,) = json.loads(capsys.readouterr().out)
    assert summary["outcomes"] == dict.fromkeys(outcomes, 1)
