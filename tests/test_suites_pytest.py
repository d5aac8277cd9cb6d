"""The suites as pytest runs them: options, the grace_record fixture, ordering, budget and records.

Runs pytest in a subprocess over a few tiny workloads (eager and CPU-skipped modes only, so nothing
compiles), with the JSON-lines record plugin of the GPU scripts as the recorder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def run_suites(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    records = tmp_path / "records.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "scripts" / "gpu")])}
    env.pop("GRACE_SUITE_TIER", None)
    argv = [sys.executable, "-m", "pytest", "suites/test_correctness.py", "suites/test_performance.py",
            "-p", "record_jsonl", f"--record-jsonl={records}", "-p", "no:cacheprovider", "-q",
            "--suite-device=cpu", *args]  # fmt: skip
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    lines = records.read_text().splitlines() if records.exists() else []
    return proc, [json.loads(line) for line in lines]


def test_records_statuses_and_order(tmp_path: Path) -> None:
    proc, lines = run_suites(
        tmp_path, "--workloads=seed_elementwise_1m,linear8_cpu_scalar", "--modes=eager,pt2cg,grace-cgct"
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    order = [
        (line["record"]["kind"], line["record"]["workload"]["name"], line["record"]["mode"]) for line in lines
    ]
    # workload by workload: its correctness tests, then its performance test
    assert [o[1] for o in order] == ["seed_elementwise_1m"] * 6 + ["linear8_cpu_scalar"] * 6
    assert [o[0] for o in order[:6]] == ["correctness"] * 3 + ["performance"] * 3
    by_key = {(o[0], o[1], o[2]): line["record"] for o, line in zip(order, lines, strict=True)}
    eager = by_key[("correctness", "linear8_cpu_scalar", "eager")]
    assert eager["status"] == "pass" and eager["workload"]["tier"] == "smoke"
    assert "cgct" in eager["workload"]["tags"] and len(eager["workload"]["code_hash"]) == 16
    assert by_key[("correctness", "seed_elementwise_1m", "pt2cg")]["status"] == "skip"
    assert "no CUDA device" in by_key[("correctness", "seed_elementwise_1m", "grace-cgct")]["reason"]
    perf = [r for k, r in by_key.items() if k[0] == "performance"]
    assert len(perf) == 6 and all(r["status"] == "skip" and r["reason"] == "no CUDA device" for r in perf)
    assert all(line["format"] == 1 and line["nodeid"].startswith("suites/") for line in lines)


def test_timing_references_are_timed_but_never_judged_for_correctness(tmp_path: Path) -> None:
    proc, lines = run_suites(tmp_path, "--workloads=mlp", "--modes=eager,raw-graph,raw-graph-copy")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    kinds = sorted((line["record"]["kind"], line["record"]["mode"]) for line in lines)
    assert kinds == [
        ("correctness", "eager"),
        ("performance", "eager"),
        ("performance", "raw-graph"),
        ("performance", "raw-graph-copy"),
    ]


def test_time_budget_skips_without_records(tmp_path: Path) -> None:
    proc, lines = run_suites(tmp_path, "--workloads=mlp", "--modes=eager", "--time-budget-s=1e-9", "-rs")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert lines == [] and "time budget" in proc.stdout


def test_unknown_selection_is_a_usage_error(tmp_path: Path) -> None:
    proc, _ = run_suites(tmp_path, "--workloads=no_such_workload")
    assert proc.returncode != 0 and "no workload matches" in proc.stdout + proc.stderr


def test_conftest_does_not_import_torch() -> None:
    code = "import sys, suites.conftest, suites.options, suites.records; assert 'torch' not in sys.modules"
    subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True
    )
