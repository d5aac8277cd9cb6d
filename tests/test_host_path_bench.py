"""The host-path benchmark script runs and reports raw samples (timings are recorded, not asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from scripts_support import run_script


def test_bench_script_reports_raw_samples(tmp_path: Path) -> None:
    done = run_script(
        "bench_host_path.py",
        "--inputs",
        "8",
        "--outputs",
        "5",
        "--rounds",
        "3",
        "--calls",
        "20",
        "--json",
        cwd=tmp_path,
    )
    figures = json.loads(done.stdout)
    assert (figures["inputs"], figures["outputs"]) == (8, 5)
    assert set(figures["samples_us"]) == {
        "slot_full_signature",
        "slot_recent_check",
        "pi_update",
        "output_handover",
        "output_handover_before",
    }
    assert all(len(v) == 3 and min(v) > 0 for v in figures["samples_us"].values())
    assert figures["recent_over_full"] > 0 and figures["handover_over_before"] > 0
    for flag in ("--inputs", "--outputs"):
        bad = run_script("bench_host_path.py", flag, "0", cwd=tmp_path, check=False)
        assert bad.returncode == 2 and "must be positive" in bad.stderr
