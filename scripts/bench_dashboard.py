"""Measure how long the dashboard takes to build from a store of N results (default 100,000).

Seeds a synthetic nightly history into a fresh SQLite store (not timed), then times what
``grace-matrix dashboard`` does: reading the store, regression detection on the latest run of every cell,
step detection over every history, and rendering every page. Prints the figures (``--json`` for a
machine-readable line). Usage::

    python scripts/bench_dashboard.py [--results 100000] [--keep DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from sqlalchemy import func, select

from dashboards.render import write_site
from dashboards.site import build_site
from matrix.regressions.synthetic import (
    SeededFailure,
    SeededRegression,
    results_per_run,
    seed_demo,
    seed_history,
    spec_for_results,
)
from matrix.regressions.thresholds import load_thresholds
from matrix.store.db import open_store
from matrix.store.models import RESULT_TABLES


def bench(results: int, folder: Path) -> dict[str, float | int]:
    spec = spec_for_results(results)
    last_night = spec.nights - 1
    spec = replace(
        spec,
        regressions=(
            SeededRegression(spec.cells[-1].cell_id, spec.workloads[0], "grace", 1.1, last_night - 4),
        ),
        failures=(
            SeededFailure(
                spec.cells[0].cell_id, "pi", spec.pi_subjects[0], "load", "fail", "boom", last_night
            ),
        ),
    )
    url = f"sqlite:///{folder / 'store.sqlite'}"
    store = open_store(url)
    started = time.perf_counter()
    with store.begin() as session:
        seed_history(session, spec)
        seed_demo(session)
    seeded_s = time.perf_counter() - started
    with store() as session:
        rows = {
            t.__tablename__: session.scalar(select(func.count()).select_from(t)) or 0 for t in RESULT_TABLES
        }
    thresholds = load_thresholds()
    started = time.perf_counter()
    with store() as session:
        site = build_site(session, thresholds)
    built_s = time.perf_counter() - started
    started = time.perf_counter()
    pages = write_site(site, folder / "site")
    written_s = time.perf_counter() - started
    return {
        "results": site.result_count,
        "rows_by_table": rows,  # type: ignore[dict-item]
        "runs": len(site.runs),
        "results_per_run": results_per_run(spec),
        "pages": len(pages),
        "regressions": len(site.regressions),
        "seed_s": round(seeded_s, 2),
        "build_s": round(built_s, 3),
        "write_s": round(written_s, 3),
        "total_s": round(built_s + written_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=int, default=100_000, help="result rows to seed (default 100000)")
    parser.add_argument("--keep", metavar="DIR", help="keep the store and the site in DIR")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as scratch:
        folder = Path(args.keep) if args.keep else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        figures = bench(args.results, folder)
    if args.json:
        print(json.dumps(figures))
    else:
        print(
            f"{figures['results']} results in {figures['runs']} runs ({figures['regressions']} regressions): "
            f"build {figures['build_s']} s + write {figures['pages']} pages {figures['write_s']} s "
            f"= {figures['total_s']} s (seeding, not timed: {figures['seed_s']} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
