"""The dashboard benchmark script runs and reports its figures (the timing itself is recorded, not
asserted: a timed unit test on a shared 2-core machine would be flaky)."""

from __future__ import annotations

import json
from pathlib import Path

from scripts_support import run_script


def test_bench_script_reports_its_figures(tmp_path: Path) -> None:
    done = run_script(
        "bench_dashboard.py", "--results", "3000", "--json", "--keep", str(tmp_path), cwd=tmp_path
    )
    figures = json.loads(done.stdout)
    assert figures["results"] >= 3000
    assert figures["results"] == sum(v for k, v in figures["rows_by_table"].items() if k != "test_outcomes")
    assert figures["regressions"] >= 2  # the seeded PI failure and the demo's regression at least
    assert abs(figures["total_s"] - (figures["build_s"] + figures["write_s"])) <= 0.002  # each rounded to ms
    assert (tmp_path / "site" / "index.html").is_file()
