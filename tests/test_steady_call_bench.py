"""The steady-call benchmark script runs, replays on every timed call and reports raw samples (timings are
recorded, not asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from scripts_support import run_script

STEPS = {
    "runner_call",
    "release_unheld",
    "calling_threads_note",
    "recent_matches",
    "static_unmoved",
    "call_generation",
    "held_outputs",
    "inputs_moved",
    "order_streams",
    "stream_key",
    "pi_update",
    "copy_in_none",
    "collect_outputs",
    "steady_call",
    "dynamo_floor",
    "dynamo_fixed",
    "dynamo_runner",
}


def test_steady_call_bench_replays_every_call_and_reports_raw_samples(tmp_path: Path) -> None:
    done = run_script(
        "bench_steady_call.py", "--static", "4", "--rounds", "3", "--calls", "20", "--json", cwd=tmp_path
    )
    figures = json.loads(done.stdout)
    assert figures["static_inputs"] == 4
    assert set(figures["samples_us"]) == STEPS
    assert all(len(v) == 3 and min(v) > 0 for v in figures["samples_us"].values())
    # Every timed runner call went through the graph, not a fallback: the figure is the replay path's
    # (the runner's calls alone, the steady call alone and through Dynamo, 60 each).
    assert figures["runner_calls"] == 60
    assert figures["runner_calls_replayed"] == 180


def test_steady_call_bench_refuses_bad_counts(tmp_path: Path) -> None:
    for flag, value in (("--rounds", "0"), ("--calls", "0"), ("--static", "-1")):
        bad = run_script("bench_steady_call.py", flag, value, cwd=tmp_path, check=False)
        assert bad.returncode == 2
        assert "must be" in bad.stderr.strip().splitlines()[-1]
