"""The dashboard benchmark script runs and reports its figures (the timing itself is recorded, not
asserted: a timed unit test on a shared 2-core machine would be flaky)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_script_reports_its_figures(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench_dashboard.py"),
            "--results",
            "3000",
            "--json",
            "--keep",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    figures = json.loads(done.stdout)
    assert figures["results"] >= 3000
    assert figures["results"] == sum(v for k, v in figures["rows_by_table"].items() if k != "test_outcomes")
    assert figures["regressions"] >= 2  # the seeded PI failure and the demo's regression at least
    assert abs(figures["total_s"] - (figures["build_s"] + figures["write_s"])) <= 0.002  # each rounded to ms
    assert (tmp_path / "site" / "index.html").is_file()
