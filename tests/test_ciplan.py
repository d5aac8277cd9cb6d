"""The nightly workflow: generated from matrix.toml and runners.toml, committed, validated, never drifting."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import one_error_line
from hypothesis import given
from hypothesis import strategies as st

from matrix import ciyaml
from matrix.cells import CellKind, load_matrix, parse_matrix
from matrix.ciplan import WORKFLOW_PATH, build_workflow, job_id, plan_cells, render
from matrix.errors import ConfigError
from matrix.runners import DEFAULT_RUNNERS_PATH, load_runners, parse_runners
from matrix_cli.main import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
MATRIX = REPO / "matrix.toml"
WORKFLOW = REPO / WORKFLOW_PATH


def _load_workflow(text: str) -> dict[str, Any]:
    return yaml.safe_load(text)


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    return _load_workflow(WORKFLOW.read_text(encoding="utf-8"))


# -- drift ---------------------------------------------------------------------------------------------


def test_committed_workflow_matches_matrix_toml() -> None:
    expected = render(load_matrix(MATRIX), load_runners())
    assert WORKFLOW.read_text(encoding="utf-8") == expected, (
        f"{WORKFLOW_PATH} drifted from matrix.toml / matrix/runners.toml: run `grace-matrix ci-plan --write`"
    )


def test_check_fails_on_drift_and_write_repairs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "matrix.toml"
    shutil.copy(MATRIX, config)
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(WORKFLOW, tmp_path / WORKFLOW_PATH)
    assert main(["ci-plan", "--check", "--config", str(config)]) == 0

    text = config.read_text(encoding="utf-8")
    new_cell = '[[cells]]\nid = "torch-2.16"\nkind = "venv"\n'
    new_cell += 'torch = "2.16.0"\ntriton = "3.9.0"\ncuda = "13.2"\n'
    config.write_text(text + "\n" + new_cell, encoding="utf-8")
    capsys.readouterr()
    assert main(["ci-plan", "--check", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "out of date" in err and "ci-plan --write" in err
    assert "+  cell_torch-2_16:" in err  # the diff names the missing job

    assert main(["ci-plan", "--write", "--config", str(config)]) == 0
    assert main(["ci-plan", "--check", "--config", str(config)]) == 0
    jobs = _load_workflow((tmp_path / WORKFLOW_PATH).read_text())["jobs"]
    assert "cell_torch-2_16" in jobs and "cell_torch-2_16" in jobs["report"]["needs"]


# -- content -------------------------------------------------------------------------------------------


def test_one_job_per_cell_on_runners_chosen_by_gpu_and_cuda(workflow: dict[str, Any]) -> None:
    matrix = load_matrix(MATRIX)
    jobs = workflow["jobs"]
    runners = load_runners()
    for cell in matrix.cells:
        job = jobs[job_id(cell.id)]
        labels = job["runs-on"] if isinstance(job["runs-on"], list) else [job["runs-on"]]
        if cell.kind is CellKind.VENV:
            assert f"gpu-{runners.gpu_model}" in labels and cell.cuda_variant in labels, cell.id
        elif cell.kind is CellKind.TRITON_ONLY:
            assert labels == ["ubuntu-latest"], cell.id
        else:
            assert "torch-image" in labels and not any(
                s.get("uses", "").startswith("actions/setup-python") for s in job["steps"]
            )
        runs = [s["run"] for s in job["steps"] if "run" in s]
        assert f'python -m nox -s "cell({cell.id})"\n' in runs
        upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
        assert upload["with"]["name"] == f"store-{cell.id}" and upload["if"] == "${{ !cancelled() }}"
        export = next(r for r in runs if "grace-matrix export" in r)
        assert upload["with"]["path"] in export
    cell_jobs = {k for k in jobs if k.startswith("cell_")}
    assert len(cell_jobs) == len(matrix.cells)
    assert set(jobs["report"]["needs"]) == cell_jobs | {"plan"}


def test_report_job_merges_judges_publishes_and_fails_on_new_regressions(workflow: dict[str, Any]) -> None:
    report = workflow["jobs"]["report"]
    assert report["if"].startswith("${{ !cancelled()")  # runs when some cells failed
    steps = report["steps"]
    download = next(s for s in steps if s.get("uses", "").startswith("actions/download-artifact"))
    assert download["with"]["pattern"] == "store-*"
    text = "\n".join(s.get("run", "") for s in steps)
    assert "nightly-previous.sh" in text and "grace-matrix ingest" in text
    assert 'grace-matrix regressions --run "$GRACE_MATRIX_LABEL"' in text
    assert "grace-matrix dashboard --out nightly/site" in text
    names = [s["name"] for s in steps]
    assert names[-1] == "Fail on new regressions"
    assert steps[-1]["if"] == "${{ steps.regressions.outputs.status == '1' }}"
    # everything worth keeping is saved before the verdict
    assert names.index("Upload the merged store (the next nightly's baseline)") < len(names) - 1
    assert workflow["jobs"]["pages"]["needs"] == "report"
    assert (REPO / ".ci" / "nightly-previous.sh").is_file()


def test_workflow_passes_the_github_workflow_schema() -> None:
    """The committed workflow against the GitHub Actions workflow schema vendored by check-jsonschema."""
    try:
        import check_jsonschema  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("check-jsonschema is missing: install grace-matrix[test]")
        pytest.skip("check-jsonschema is not installed (pip install grace-matrix[test])")
    argv = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows"]
    result = subprocess.run([*argv, str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_rejects_a_broken_workflow(tmp_path: Path) -> None:
    pytest.importorskip("check_jsonschema")
    data = _load_workflow(WORKFLOW.read_text(encoding="utf-8"))
    data["jobs"]["plan"]["timeout-minutes"] = "ten"
    data["jobs"]["plan"]["stepz"] = data["jobs"]["plan"].pop("steps")
    bad = tmp_path / "nightly.yml"
    bad.write_text(ciyaml.dump(data), encoding="utf-8")
    argv = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(bad)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "jobs.plan" in result.stdout


def test_yaml_text_reads_back_as_the_workflow_data() -> None:
    data, _ = build_workflow(load_matrix(MATRIX), load_runners())
    assert yaml.safe_load(ciyaml.dump(data)) == data


@given(st.text(max_size=40))
def test_any_string_survives_the_yaml_writer(value: str) -> None:
    assert yaml.safe_load(ciyaml.dump({"k": value, "l": [value, "x"]})) == {"k": value, "l": [value, "x"]}


# -- runners.toml --------------------------------------------------------------------------------------


def _runners() -> dict[str, Any]:
    return tomllib.loads(DEFAULT_RUNNERS_PATH.read_text(encoding="utf-8"))


def test_cell_overrides_choose_another_gpu() -> None:
    data = _runners()
    data["cells"] = {"torch-2.4": {"gpu": "a100", "timeout-minutes": 300}}
    runners = parse_runners(data)
    plan = plan_cells(load_matrix(MATRIX), runners)
    job = next(j for j in plan.jobs if j.cell.id == "torch-2.4")
    assert "gpu-a100" in job.profile.runs_on and job.profile.timeout_minutes == 300


def test_the_multi_gpu_cell_runs_on_a_multi_gpu_runner(workflow: dict[str, Any]) -> None:
    labels = workflow["jobs"][job_id("current-multi-gpu")]["runs-on"]
    assert "multi-gpu" in labels and "torch-image" in labels
    assert "multi-gpu" not in workflow["jobs"][job_id("current")]["runs-on"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["kinds"]["triton-only"].update({"runs-on": ["{cuda_variant}"]}), "does not have"),
        (lambda d: d.update({"cells": {"torch-9.9": {"gpu": "a100"}}}), "cells.torch-9.9: no such cell"),
        (lambda d: d["kinds"]["venv"].update({"runs-on": ["gpu-{model}"]}), "names {model}"),
        (lambda d: d["kinds"].pop("current"), "add [kinds.current]"),
        (lambda d: d["workflow"].update({"cron": "nightly"}), "workflow.cron"),
        (lambda d: d["workflow"].update({"retention": 3}), "unknown key 'retention'"),
    ],
)
def test_runner_file_errors_name_the_key(change: Any, message: str) -> None:
    data = _runners()
    change(data)
    with pytest.raises(ConfigError) as info:
        runners = parse_runners(data, "runners.toml")
        plan_cells(load_matrix(MATRIX), runners)
    assert message in str(info.value) and str(info.value).startswith("runners.toml")


def test_excluded_cells_get_no_job_and_are_named_in_the_header() -> None:
    data = _runners()
    data["workflow"]["python"] = "3.13"
    runners = parse_runners(data)
    matrix = load_matrix(MATRIX)
    plan = plan_cells(matrix, runners)
    skipped = {s.cell_id for s in plan.skipped}
    assert {"torch-2.4", "torch-2.5", "triton-3.0", "triton-3.1"} <= skipped
    assert not skipped & {j.cell.id for j in plan.jobs}
    assert "  torch-2.4: torch 2.4.1 and triton 3.0.0" in render(matrix, runners)


def test_job_ids_must_stay_unique() -> None:
    raw = {
        "format": 1,
        "default_tag": "quick",
        "cells": [
            {"id": "a.b", "kind": "triton-only", "triton": "3.0.0", "tags": ["quick"]},
            {"id": "a_b", "kind": "triton-only", "triton": "3.1.0"},
        ],
    }
    runners = parse_runners({**_runners(), "cells": {}})  # the shipped overrides name shipped cells
    with pytest.raises(ConfigError, match="same CI job id 'cell_a_b'"):
        plan_cells(parse_matrix(raw), runners)


def test_a_final_newline_is_never_written_plain() -> None:
    """``$`` matches before a final newline: "A\\n" once passed as a plain scalar and lost its newline."""
    data = {"k": "A\n", "l": ["A\n", "x"]}
    assert yaml.safe_load(ciyaml.dump(data)) == data


def test_write_never_replaces_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store.sqlite"
    sqlite3.connect(store).execute("create table t (x)").connection.commit()
    before = store.read_bytes()
    assert main(["ci-plan", "--write", "--config", str(MATRIX), "--output", str(store)]) == 2
    assert "is an SQLite database" in one_error_line(capsys)
    assert store.read_bytes() == before
