"""scripts/gpu/head_plan.py: what the next GPU call of a head run must run, from the parts' exports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from report_store import Store
from scripts_support import ROOT, run_script

from matrix_cli.main import main
from suites.modes import SPECS, Mode
from suites.workloads import names as workload_names

SHA = "0123456789abcdef0123456789abcdef01234567"


def export_part(tmp_path: Path, name: str, sha: str, results: dict[str, dict[str, float | None]]) -> Path:
    """One lease call's export: a run labelled with the head label, holding ``results``."""
    store = Store(tmp_path / name)
    with store.Session.begin() as s:
        run = store.run(s, store.cell(s), 0)
        run.git_sha, run.label = sha, f"head-{SHA[:12]}"
        for workload, medians in results.items():
            store.results(s, run, workload, medians)
    out = tmp_path / f"{name}.jsonl"
    assert main(["export", "--db", store.url, "-o", str(out)]) == 0
    return out


@pytest.fixture
def parts(tmp_path: Path) -> list[Path]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = workload_names()[:2]
    return [
        export_part(tmp_path, "a", SHA, {first: {"grace": 1.0, "pt2cg": 1.0}}),
        export_part(tmp_path, "b", SHA, {second: {"grace": 1.0}}),
    ]


def test_the_plan_lists_what_no_part_recorded_in_run_order(parts, tmp_path) -> None:
    done = run_script("gpu/head_plan.py", "--sha", SHA, "--modes", "grace,pt2cg", "--json", *map(str, parts),
                      cwd=tmp_path, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    names = workload_names()
    assert (plan["runs"], plan["done"], plan["wanted"]) == (2, 3, 2 * len(names))
    assert plan["missing"][names[1]] == ["pt2cg"] and names[0] not in plan["missing"]
    assert plan["next_workloads"] == names[1:]  # the registry's order: cheap ones first
    text = run_script("gpu/head_plan.py", "--sha", SHA, "--modes", "grace", *map(str, parts), cwd=tmp_path)
    assert text.stdout.startswith(f"head-{SHA[:12]} at {SHA}: 2 of {len(names)}")
    assert f"next: --workloads {','.join(names[2:])} --modes grace --label head-{SHA[:12]}" in text.stdout
    exports = [str(p) for p in parts]
    args = run_script(
        "gpu/head_plan.py", "--sha", SHA, "--modes", "grace,pt2cg", "--next-args", *exports, cwd=tmp_path
    )
    assert args.stdout.splitlines() == [
        "--workloads",
        ",".join(names[1:]),
        "--modes",
        "grace,pt2cg",
        "--label",
        f"head-{SHA[:12]}",
    ]  # what session.sh's step head passes to run_suites.sh


def test_a_label_that_mixes_commits_is_refused(parts, tmp_path) -> None:
    (tmp_path / "c").mkdir()
    other = export_part(tmp_path, "c", "f" * 40, {workload_names()[3]: {"grace": 1.0}})
    done = run_script(
        "gpu/head_plan.py", "--sha", SHA, *map(str, parts), str(other), cwd=tmp_path, check=False
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"head_plan: error: label head-{SHA[:12]} has runs at other commits than {SHA}: {'f' * 40}"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sha", "xyz1234"], "is not a full commit id"),
        (["--sha", SHA[:12]], "is not a full commit id"),
        (["--sha", SHA, "--modes", "grace,grace-cpu"], "--modes: grace-cpu; choose from"),
        (["--sha", SHA, "missing.jsonl"], "missing.jsonl: cannot read"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message) -> None:
    done = run_script("gpu/head_plan.py", *args, cwd=tmp_path, check=False)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_the_session_step_says_complete_once_every_pair_is_recorded(tmp_path) -> None:
    """``session.sh head``: with every (workload, mode) in the parts so far, nothing is run."""
    parts = tmp_path / "head"
    parts.mkdir()
    gpu_modes = [mode.value for mode in Mode if not SPECS[mode].cpu_only]
    everything = {name: dict.fromkeys(gpu_modes, 1.0) for name in workload_names()}
    export_part(parts, "all", SHA, everything)
    env = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "GRACE_HEAD_EXPORTS": str(parts),
        "GRACE_MATRIX_GIT_SHA": SHA,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    done = subprocess.run(["bash", str(ROOT / "scripts/gpu/session.sh"), "head:60"], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    log = (tmp_path / "out" / "session.log").read_text()
    assert done.returncode == 0 and f"head run at {SHA}: complete (1 part(s))" in log, log
    assert "run_suites" not in log
