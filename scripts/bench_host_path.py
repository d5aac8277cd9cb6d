"""Measure the host time grace spends per call before a replay, for a callable of N tensor inputs.

A launch-bound workload pays every microsecond of Python the runner spends before it launches the
graph. This times, on the CPU (no GPU needed: the steps measured are pure host work), the two steps
that grow with the number of inputs:

- choosing the graph slot: ``GraceRunner.signature`` + the slot lookup (the full path) against the
  recent-slot check of the same runner (``_RecentSlot.matches``), side by side in one run;
- ``PiPlan.update``: gathering the inputs' addresses and building the pointer table's values (the
  table itself is a stand-in that keeps the values; its device copy is not part of this measure);
- the output handover after a replay, for a graph of ``--outputs`` outputs that autograd keeps (a
  training forward's saved tensors): the held check and the aliases handed out
  (``CapturedGraph.held_outputs`` + ``collect_outputs``), against the same two steps done as grace did
  them before (a Python use-count check per storage, ``as_strided`` aliases), in one run.

Each figure is the median of ``--rounds`` raw samples (each the mean of ``--calls`` calls); the two
slot paths are sampled in a seeded random order per round. ``--json`` prints one machine-readable line
with the raw samples. Usage::

    python scripts/bench_host_path.py [--inputs 64] [--outputs 100] [--rounds 30] [--calls 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from grace.compat import torch as torch_compat
from grace.graph import CapturedGraph
from grace.options import GraceOptions
from grace.pi import plan as pi_plan
from grace.runner import GraceRunner, RunnerPlan, _RecentSlot


class _ValuesTable:
    """Stands in for the device pointer table: keeps the values, copies nothing."""

    bytes_per_copy = 0

    def __init__(self) -> None:
        self.values: tuple[int, ...] = ()

    def write(self, values: Sequence[int]) -> bool:
        self.values = tuple(values)
        return True


class _NoReplay:
    def replay(self) -> None:
        pass


def _handover_paths(outputs: int) -> dict[str, Callable[[], Any]]:
    """The output handover of a graph whose ``outputs`` autograd keeps, now and as it was done before."""
    own = [torch.empty(64) for _ in range(outputs)]
    graph = CapturedGraph.assemble(
        graph=_NoReplay(),
        device=torch.device("cpu"),
        placeholders={},
        copy_indices=(),
        mutated_indices=(),
        outputs=list(own),
        output_container="list",
        aliases=(),
        static_indices=(),
        static_ptrs=[],
        kept_from=0,
    )
    refs = graph.outputs_owner.family.refs

    def handover() -> Any:
        graph.held_outputs(1)
        return graph.collect_outputs((), False)

    def handover_before() -> Any:
        any(torch_compat.storage_use_count(ref) > count for ref, count in refs)
        return [o.as_strided(o.size(), o.stride(), o.storage_offset()) for o in graph.outputs]

    return {"output_handover": handover, "output_handover_before": handover_before}


def _sample(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def bench(inputs: int, rounds: int, calls: int, seed: int = 0, outputs: int = 100) -> dict[str, Any]:
    args = [torch.empty(1024) for _ in range(inputs)]
    plan = RunnerPlan(
        graph_hash="bench",
        device=torch.device("cpu"),
        static_indices=(),
        dynamic_indices=tuple(range(inputs)),
        scalar_indices=(),
    )
    runner = GraceRunner(lambda *a: a, plan, GraceOptions(), None)
    slots = {runner.signature(args): object()}
    recent = _RecentSlot.build(plan, args, object())  # type: ignore[arg-type]
    if recent is None:
        raise SystemExit("this torch has no C tensor check: the runner always takes the full path")
    # The CPU tensors stand for CUDA ones: the address gathering is the same work either way.
    pi_plan.device_addresses = lambda values: [v.data_ptr() for v in values]  # type: ignore[assignment]
    placeholders = {i: 0x10000 * (i + 1) for i in range(inputs)}
    slots_of_plan = [pi_plan.Slot(i, 0, 16) for i in range(inputs)]
    pi = pi_plan.PiPlan(
        _ValuesTable(), slots_of_plan, placeholders, tuple(range(inputs)), {}, pi_plan.StageLog()
    )
    paths: dict[str, Callable[[], Any]] = {
        "slot_full_signature": lambda: slots.get(runner.signature(args)),
        "slot_recent_check": lambda: recent.matches(args),
        "pi_update": lambda: pi.update(args),
        **_handover_paths(outputs),
    }
    for fn in paths.values():
        fn()
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        order = list(paths)
        rng.shuffle(order)
        for name in order:
            samples[name].append(_sample(paths[name], calls))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    ratio = statistics.median(
        r / f for r, f in zip(samples["slot_recent_check"], samples["slot_full_signature"], strict=True)
    )
    handover_ratio = statistics.median(
        n / b for n, b in zip(samples["output_handover"], samples["output_handover_before"], strict=True)
    )
    return {
        "inputs": inputs,
        "outputs": outputs,
        "rounds": rounds,
        "calls_per_sample": calls,
        "torch": torch.__version__,
        "median_us": medians,
        "recent_over_full": ratio,
        "handover_over_before": handover_ratio,
        "samples_us": samples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--outputs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(argv)
    if ns.inputs < 1 or ns.outputs < 1 or ns.rounds < 1 or ns.calls < 1:
        parser.error("--inputs, --outputs, --rounds and --calls must be positive")
    result = bench(ns.inputs, ns.rounds, ns.calls, outputs=ns.outputs)
    if ns.json:
        print(json.dumps(result))
        return 0
    m = result["median_us"]
    print(f"{ns.inputs} tensor inputs, torch {result['torch']}, median of {ns.rounds} samples:")
    print(f"  slot choice, full signature: {m['slot_full_signature']:8.2f} us")
    print(f"  slot choice, recent check:   {m['slot_recent_check']:8.2f} us")
    print(f"    ratio (paired, median):    {result['recent_over_full']:8.3f}")
    print(f"  PiPlan.update:               {m['pi_update']:8.2f} us")
    print(f"  {ns.outputs} outputs handed over:     {m['output_handover']:8.2f} us")
    print(f"    as done before:            {m['output_handover_before']:8.2f} us")
    print(f"    ratio (paired, median):    {result['handover_over_before']:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
