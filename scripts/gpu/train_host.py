"""Diagnostic: where a steady training step's host time goes, per mode, and what grace adds to it.

For each training workload (standard tier) and mode (``pt2cg``, ``grace`` or ``grace:key=value,...``
as in train_memory.py), a ``suites.training.TrainStep`` runs ``--warmup`` steps (compiles, recordings
and grace's deciding calls), then, interleaved round by round with the other modes of the workload:

- ``step_ms``: one step between two synchronisations (host clock), the suites' measure;
- ``host_ms``: the host time of the same step up to its return, before the synchronisation: a step
  whose host time is close to its step time is host-bound;
- ``gpu_ms``: CUDA events around the step (device time from its first to its last queued work).

Then one cProfile of ``--profiled`` steady steps per mode: the top functions by cumulative time and,
for grace, the time per step inside its runners (``GraceRunner.run``), the number of runner calls
per step, and grace's graphs (variant, calls, held-output calls).

Run from the repository root: ``python scripts/gpu/train_host.py --out DIR --workloads A,B
--modes pt2cg;grace``. Writes ``train_host.json`` under ``--out`` after every workload.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from probe import graphs  # this directory is first on the path of a script run from it
from train_memory import environment, forget_compiled, fresh_workload, record_entry

import grace
from suites.modes import reset_compilers
from suites.training import TrainStep


def _timed_step(step: TrainStep, inputs: tuple[Any, ...]) -> tuple[float, float, float]:
    """(step_ms, host_ms, gpu_ms) of one step."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    start.record()
    loss = step(*inputs)
    end.record()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    del loss
    return (t2 - t0) * 1e3, (t1 - t0) * 1e3, start.elapsed_time(end)


def _profile(step: TrainStep, inputs: tuple[Any, ...], steps: int) -> dict[str, Any]:
    profiler = cProfile.Profile()
    torch.cuda.synchronize()
    profiler.enable()
    for _ in range(steps):
        loss = step(*inputs)
        del loss
    torch.cuda.synchronize()
    profiler.disable()
    stats = pstats.Stats(profiler)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(45)
    runner = [
        (calls, cumulative)
        for (path, _, name), (_, calls, _, cumulative, _) in stats.stats.items()  # type: ignore[attr-defined]
        if path.endswith("grace/runner.py") and name == "run"
    ]
    own = io.StringIO()
    pstats.Stats(profiler, stream=own).sort_stats("tottime").print_stats(30)
    return {
        "runner_calls_per_step": sum(c for c, _ in runner) / steps,
        "runner_ms_per_step": round(sum(t for _, t in runner) / steps * 1e3, 3),
        "cumulative": text.getvalue()[-9000:],
        "own": own.getvalue()[-6000:],
    }


def workload(name: str, modes: list[str], warmup: int, rounds: int, profiled: int) -> dict[str, Any]:
    steps: dict[str, tuple[TrainStep, tuple[Any, ...]]] = {}
    result: dict[str, Any] = {}
    reset_compilers()  # once: every mode's compiled step lives through the interleaved rounds
    for text in modes:
        mode, model, inputs = fresh_workload(name, text)
        step = TrainStep(mode, model, "cuda")
        with torch.no_grad():
            for _ in range(warmup):
                step(*inputs)
        torch.cuda.synchronize()
        steps[text] = (step, inputs)
        result[text] = {"samples": []}
    # Interleaved rounds: each mode's step once per round, in the listed order.
    with torch.no_grad():
        for _ in range(rounds):
            for text, (step, inputs) in steps.items():
                result[text]["samples"].append(_timed_step(step, inputs))
        for text, (step, inputs) in steps.items():
            samples = result[text]["samples"]
            for i, field in enumerate(("step_ms", "host_ms", "gpu_ms")):
                result[text][field] = round(statistics.median(s[i] for s in samples), 3)
            result[text]["profile"] = _profile(step, inputs, profiled)
            if text.startswith("grace"):
                result[text]["graphs"] = graphs()
    steps.clear()
    forget_compiled()
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workloads", default="DebertaForMaskedLM_train")
    parser.add_argument("--modes", default="pt2cg;grace")
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--profiled", type=int, default=5)
    parser.add_argument("--deadline-s", type=float, default=300.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.deadline_s
    results = environment()
    path = args.out / "train_host.json"
    modes = args.modes.split(";")
    for name in args.workloads.split(","):
        grace.stats.reset()
        run = functools.partial(workload, name, modes, args.warmup, args.rounds, args.profiled)
        value = record_entry(results, name, path, deadline, run)
        if value is None:
            continue
        for mode, entry in value.items():
            if isinstance(entry, dict) and "step_ms" in entry:
                profile = entry["profile"]
                print(
                    f"{name}/{mode}: step {entry['step_ms']} ms, host {entry['host_ms']} ms, gpu "
                    f"{entry['gpu_ms']} ms; runner {profile['runner_calls_per_step']} calls "
                    f"{profile['runner_ms_per_step']} ms per step (profiled)",
                    flush=True,
                )
        if "error" in value:
            print(f"{name}: {value['error']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
