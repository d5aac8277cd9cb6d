"""Measure the host time per runner call of a training step whose graphs share one pool (``step_pool``).

A host-bound training step pays every check a replay makes before it launches. Under ``step_pool`` a
replay first asks whether it may overwrite an output another graph of the pool still needs, and a
slot's output sets are taken earliest first (grace.outputsets), so a call may check several sets. This
times that work on the CPU (no GPU: the graphs are the tests' stand-ins, whose replay copies one
tensor), for a model of ``--layers`` layers that calls one compiled forward per layer (``--saved``
saved tensors each) and then one backward per layer in reverse (``--grads`` parameter gradients
each, held until the step ends, as ``.grad`` would be), in three modes side by side:

- ``own-pools``: option ``step_pool`` off (each output set in a pool of its own);
- ``step-pool-layout``: one pool, each capture's footprint unknown (the layout's bound: it may
  overwrite every member captured after it);
- ``step-pool-traced``: one pool, each capture's footprint its own outputs (what the allocator's
  history gives where the capture's temporaries are its outputs).

Each figure is the median of ``--rounds`` raw samples (each the mean per runner call over ``--steps``
steps, after warm-up steps that make the output sets); the modes are sampled in a seeded random order
per round. ``--json`` prints one machine-readable line with the raw samples. Usage::

    python scripts/bench_step_pool.py [--layers 12] [--rounds 15] [--steps 40] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import fakes

import grace.runplan
import grace.slot
from grace import poolgroups
from grace.compat.aot import GraphRole
from grace.options import GraceOptions
from grace.runner import GraceRunner, RunnerPlan

CPU = torch.device("cpu")
MODES = ("own-pools", "step-pool-layout", "step-pool-traced")
Step = Callable[[], None]


def _capture(traced: bool, counts: dict[GraphRole, int]) -> Callable[[Any, Sequence[Any]], Any]:
    """Fake captures whose outputs number ``counts`` per role (what the runner's callable returns)."""

    def capture(facts: Any, args: Sequence[Any]) -> Any:
        outputs = [torch.zeros(64) for _ in range(counts[facts.plan.role])]
        placeholders = {i: torch.zeros_like(a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)}

        class Replay:
            def replay(self) -> None:
                outputs[0].copy_(placeholders[0])

        graph = fakes.captured_graph(
            Replay(), placeholders=placeholders, outputs=list(outputs), kept_from=facts.plan.kept_from
        )
        if facts.pool_group is not None:
            footprint = graph.output_spans() if traced else None
            graph.join_pool_group(facts.pool_group, facts.record, footprint)
        return graph

    return capture


def _runner(role: GraphRole, inputs: int, outputs: int, options: GraceOptions) -> GraceRunner:
    plan = RunnerPlan(
        "h",
        CPU,
        static_indices=(),
        dynamic_indices=tuple(range(inputs)),
        scalar_indices=(),
        role=role,
        kept_from=1 if role is GraphRole.FORWARD else 0,
    )
    return GraceRunner(lambda *a: [a[0] * 1] + [torch.zeros(64) for _ in range(outputs)], plan, options, None)


def _mode(mode: str, args: argparse.Namespace, mp: pytest.MonkeyPatch, generation: list[int]) -> Step:
    """One training step of ``mode``'s own runners (each mode's graphs in a group of their own)."""
    group = poolgroups.PoolGroup((0, MODES.index(mode) + 1))
    options = GraceOptions(step_pool=mode != "own-pools")
    forward = _runner(GraphRole.FORWARD, 1, args.saved, options)
    backward = _runner(GraphRole.BACKWARD, args.saved + 1, args.grads, options)
    counts = {GraphRole.FORWARD: 1 + args.saved, GraphRole.BACKWARD: 1 + args.grads}
    capture = _capture(mode == "step-pool-traced", counts)

    def step() -> None:
        mp.setattr(grace.runplan, "step_group", lambda device: group)
        fakes.use_decide(mp, fakes.decides_graph(capture))
        saved, hidden, grads = [], torch.zeros(64), []
        for _ in range(args.layers):
            generation[0] += 1
            out = forward(hidden)
            hidden = out[0]
            saved.append(out[1:])
        grad = hidden
        while saved:
            generation[0] += 1
            out = backward(*saved.pop(), grad)
            grad = out[0]
            grads.append(out[1:])

    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--saved", type=int, default=20)
    parser.add_argument("--grads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    with pytest.MonkeyPatch.context() as mp:
        generation = [0]
        fakes.cpu_warmup(mp)
        mp.setattr(grace.slot.torch_compat, "compiled_call_generation", lambda: generation[0])
        steps = {mode: _mode(mode, args, mp, generation) for mode in MODES}
        for step in steps.values():
            for _ in range(6):
                step()
        order = random.Random(0)
        for _ in range(args.rounds):
            for mode in order.sample(MODES, len(MODES)):
                start = time.perf_counter()
                for _ in range(args.steps):
                    steps[mode]()
                calls = args.steps * 2 * args.layers
                samples[mode].append((time.perf_counter() - start) / calls * 1e6)
    medians = {mode: statistics.median(values) for mode, values in samples.items()}
    if args.json:
        print(json.dumps({"layers": args.layers, "us_per_call": samples, "median": medians}))
        return 0
    base = medians["own-pools"]
    print(f"{args.layers} layers, {args.saved} saved tensors, {args.grads} gradients; us per runner call:")
    for mode, value in medians.items():
        print(f"  {mode:<18} {value:8.1f}  ({value / base:.2f}x own-pools)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
