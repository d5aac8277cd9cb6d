"""scripts/gpu/run_suites.sh: its parts (two inference halves, training) cover every workload once,
and a CPU dry run brings back records, a report and the list of what remains."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import suites.workloads as registry

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu" / "run_suites.sh"


def part(name: str) -> list[str]:
    text = SCRIPT.read_text()
    pieces = re.findall(rf'^{name}\+?="([^"]*)"', text, flags=re.MULTILINE)
    return [n for piece in pieces for n in piece.lstrip(",").split(",") if n]


def test_parts_cover_every_workload_once() -> None:
    one, two, train = part("PART1"), part("PART2"), part("PART_TRAIN")
    assert sorted(one + two + train) == sorted(registry.names())


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash")
def test_cpu_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "GRACE_SUITES_CACHE": str(tmp_path / "cache"),
        "PYTHON": sys.executable,
    }
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--workloads", "mlp,alexnet", "--modes", "eager,pt2cg", "--tier", "smoke",
         "--budget-s", "120"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    log = (out / "run_suites.log").read_text()
    assert proc.returncode == 0, log[-4000:]
    records = [json.loads(line)["record"] for line in (out / "records.jsonl").read_text().splitlines()]
    statuses = {(r["kind"], r["workload"]["name"], r["mode"]): r["status"] for r in records}
    assert statuses[("correctness", "mlp", "eager")] == "pass"
    assert statuses[("correctness", "mlp", "pt2cg")] == "skip"
    assert statuses[("performance", "mlp", "eager")] == "skip"
    assert statuses[("correctness", "alexnet", "eager")] in ("pass", "skip", "model_fail_to_load")
    assert (out / "report.txt").exists() and (out / "RESULTS.md").exists()
    assert (out / "remaining.txt").read_text() == "" and (out / "incomplete.txt").read_text() == ""
    assert json.loads((out / "environment.json").read_text())["torch"]
    assert "pytest exited 0" in log
