"""The host-path benchmark script runs and reports raw samples (timings are recorded, not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_script_reports_raw_samples(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = ROOT / "scripts" / "bench_host_path.py"
    args = ["--inputs", "8", "--rounds", "3", "--calls", "20", "--json"]
    done = subprocess.run(
        [sys.executable, str(script), *args],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    figures = json.loads(done.stdout)
    assert figures["inputs"] == 8
    assert set(figures["samples_us"]) == {"slot_full_signature", "slot_recent_check", "pi_update"}
    assert all(len(v) == 3 and min(v) > 0 for v in figures["samples_us"].values())
    assert figures["recent_over_full"] > 0
    bad = subprocess.run(
        [sys.executable, str(script), "--inputs", "0"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert bad.returncode == 2 and "must be positive" in bad.stderr
