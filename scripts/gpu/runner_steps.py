"""A steady grace call taken apart: each step of the runner's replay path timed on its own, on one GPU.

``host_layers.py`` says how much of a call is grace's (``grace_runner`` - ``raw``); this says which of
the runner's steps it is. For the seed demo (four elementwise ops on 1M floats) and a 16-layer
Linear(256)+GELU stack it compiles the model with grace, calls it until the slot replays its graph, then
times, back to back and in a seeded random order per round, the whole runner call and each step that
call makes on a steady replay (the checks before the launch, the PI table update, the launch itself,
the outputs handed back, and the steady call alone where the runner has one), each step called alone
with the same arguments. The steps' sum need not equal the whole call (the call's own frames and locks
lie between them); a step that costs far more on the GPU's host than the CPU stand-in says is where the
time goes. Each step is also timed cold (``--cold-rounds``): one call right after a replay of the graph
and a synchronisation, as a synchronised (``lat``) call finds the host, its host time alone. Writes
``runner_steps.json`` under ``--out`` (raw samples, us per call; the slot's variant and whether the
steady call took the call) and prints the medians.

usage: python scripts/gpu/runner_steps.py --out DIR [--rounds 15] [--calls 2000] [--cold-rounds 40]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from host_layers import RunnerCalls, _workloads  # this directory is first on the path of a script run from it
from torch._dynamo.mutation_guard import GenerationTracker

import grace
from grace import pools, streams
from grace.backend import GraceBackend
from grace.compat import torch as torch_compat
from grace.options import GraceOptions
from grace.runner import GraceRunner
from grace.steady import MISS, STALE

# Of host_layers.WORKLOADS; the decode step's GPU work (about 1.7 ms a call) gets a tenth of the calls.
WORKLOADS = ("seed_demo", "linear_gelu_16", "llm_decode_static_kv")
FEWER_CALLS = {"llm_decode_static_kv": 10}


def _runner_and_args(
    model: Any, inputs: tuple[Any, ...], cache_dir: str
) -> tuple[GraceRunner, tuple[Any, ...]]:
    """Compile with grace, call until steady, and return the one runner with the arguments it was given."""
    compiled = torch.compile(model, backend=GraceBackend(GraceOptions(cache_dir=cache_dir)))
    with RunnerCalls() as runner_calls:
        for _ in range(30):
            compiled(*inputs)
    torch.cuda.synchronize()
    if len(runner_calls.calls) != 1:
        raise SystemExit(f"expected one grace runner, found {len(runner_calls.calls)}")
    return next(iter(runner_calls.calls.values()))


def steady_steps(
    runner: GraceRunner, args: Sequence[Any], *, launch: bool = True
) -> dict[str, Callable[[], Any]]:
    """The whole steady runner call and each step it makes, each a callable of no arguments; ``launch``:
    with the graph's own replay (a real CUDA graph). Each ``runner_call`` counts as a compiled call of its
    own (Dynamo's count moves by one), as through ``torch.compile``. Also used by the CPU stand-in
    (scripts/bench_steady_call.py)."""
    recent = runner._recent
    if recent is None:
        raise SystemExit("the runner has no recent slot: not steady")
    slot = recent.slot
    graph = slot.graph
    if graph is None or graph.pi_plan is None:
        variant = slot.record.variant.value
        raise SystemExit(f"the slot replays no PI graph (state {slot.state}, variant {variant})")
    plan = graph.pi_plan
    generation = torch_compat.compiled_call_generation()
    device = graph.device

    def runner_call() -> Any:
        GenerationTracker.generation += 1  # each call a compiled call of its own, as Dynamo counts them
        return runner(*args)

    steps: dict[str, Callable[[], Any]] = {
        "runner_call": runner_call,
        "release_unheld": pools.release_unheld,
        "calling_threads_note": streams.calling_threads.note,
        "recent_matches": lambda: recent.matches(args),
        "static_unmoved": lambda: graph.static_inputs_unmoved(args),
        "call_generation": torch_compat.compiled_call_generation,
        "held_outputs": lambda: graph.held_outputs(generation, args),
        "inputs_moved": lambda: slot.inputs_moved(args),
        "order_streams": graph.order_streams,
        "stream_key": lambda: streams.current_stream_key(device),
        "pi_update": lambda: plan.update(args),
        "copy_in_none": lambda: graph.copy_in(args, ()),
        "collect_outputs": lambda: graph.collect_outputs(args, False),
    }
    steady = runner._steady
    if steady is not None:

        def steady_call() -> Any:
            GenerationTracker.generation += 1
            return steady(recent, args)

        steps["steady_call"] = steady_call
    if launch:
        steps["graph_replay"] = graph.graph.replay
    return steps


def facts(runner: GraceRunner, steps: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """The slot's variant and whether the steady call exists and takes a call (one call made)."""
    recent = runner._recent
    variant = recent.slot.record.variant.value if recent is not None else None
    steady = steps.get("steady_call")
    hit = steady is not None and steady() not in (MISS, STALE)
    return {"variant": variant, "steady_call": steady is not None, "steady_call_hits": hit}


def time_cold(
    steps: dict[str, Callable[[], Any]], rounds: int, rng: random.Random, before: Callable[[], Any]
) -> dict[str, Any]:
    """Each step's host time for one call made right after ``before`` (a replay and a synchronisation),
    ``rounds`` samples, the steps in a shuffled order per round."""
    samples: dict[str, list[float]] = {step: [] for step in steps}
    for _ in range(rounds):
        order = list(steps)
        rng.shuffle(order)
        for step in order:
            before()
            start = time.perf_counter()
            steps[step]()
            samples[step].append((time.perf_counter() - start) * 1e6)
    return {"samples_us": samples, "median_us": {step: statistics.median(v) for step, v in samples.items()}}


def _sample(fn: Callable[[], Any], calls: int, sync: Callable[[], Any] | None) -> float:
    if sync is not None:
        sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    if sync is not None:
        sync()
    return elapsed / calls * 1e6


def time_steps(
    runner: GraceRunner,
    steps: dict[str, Callable[[], Any]],
    rounds: int,
    calls: int,
    rng: random.Random,
    sync: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Each step timed ``rounds`` times (``calls`` calls per sample, the steps in a shuffled order per
    round, ``sync`` around each sample), with the medians and how many runner calls replayed the graph."""
    record = runner._recent.slot.record if runner._recent is not None else None
    replays_before = record.graph_calls if record is not None else 0
    samples: dict[str, list[float]] = {step: [] for step in steps}
    for _ in range(rounds):
        order = list(steps)
        rng.shuffle(order)
        for step in order:
            samples[step].append(_sample(steps[step], calls, sync))
    replays = (record.graph_calls if record is not None else 0) - replays_before
    return {
        "runner_calls": rounds * calls,
        "runner_calls_replayed": replays,
        "samples_us": samples,
        "median_us": {step: statistics.median(values) for step, values in samples.items()},
    }


def run(rounds: int, calls: int, cold_rounds: int, cache_dir: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    rng = random.Random(0)
    for name, (model, inputs) in _workloads(WORKLOADS).items():
        torch._dynamo.reset()
        grace.reset()
        with torch.no_grad():
            try:  # a workload that is not one steady PI graph is reported, and the others still run
                runner, args = _runner_and_args(model, inputs, cache_dir)
                steps = steady_steps(runner, args)
            except SystemExit as exc:
                results[name] = {"skipped": str(exc)}
                continue
            for fn in steps.values():
                fn()
            n = max(1, calls // FEWER_CALLS.get(name, 1))
            results[name] = {
                **facts(runner, steps),
                **time_steps(runner, steps, rounds, n, rng, torch.cuda.synchronize),
                "cold": time_cold(
                    steps,
                    cold_rounds,
                    rng,
                    lambda replay=steps["graph_replay"]: (replay(), torch.cuda.synchronize()),
                ),
            }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--cold-rounds", type=int, default=40)
    ns = parser.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as cache_dir:
        results = run(ns.rounds, ns.calls, ns.cold_rounds, cache_dir)
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    document = {
        "format_version": 2,
        "env": env,
        "rounds": ns.rounds,
        "calls": ns.calls,
        "cold_rounds": ns.cold_rounds,
        "results": results,
    }
    (ns.out / "runner_steps.json").write_text(json.dumps(document))
    for name, result in results.items():
        if "skipped" in result:
            print(f"{name}: skipped: {result['skipped']}")
            continue
        replayed = f"{result['runner_calls_replayed']} of {result['runner_calls']} runner calls replayed"
        steady = f"steady call {result['steady_call']}, takes the call {result['steady_call_hits']}"
        print(f"{name}: variant {result['variant']}, {steady}")
        print(f"  us per call, median of {ns.rounds} rounds ({replayed}); cold, median of {ns.cold_rounds}")
        for step, value in result["median_us"].items():
            print(f"  {step:<22}{value:9.2f}{result['cold']['median_us'][step]:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
