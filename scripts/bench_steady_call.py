"""A CPU stand-in of grace's steady call: the runner's replay path, with a replay that launches nothing.

``scripts/gpu/runner_steps.py`` times each step of a steady runner call on the GPU; this times the same steps
on the CPU, where no device is needed because every step but the launch is host work: a real ``GraceRunner``
whose slot holds a real ``CapturedGraph`` with a PI plan (one dynamic input, ``--static`` static ones, one
output), its CUDA graph a stand-in whose replay does nothing and its pointer table a stand-in that keeps the
values. Each call counts as a compiled call of its own (Dynamo's count moves by one), as through
``torch.compile``. Beside them, ``dynamo_floor``: the seed demo (four elementwise ops on 1M floats) through
``torch.compile`` with a backend whose callable returns a fixed tensor, Dynamo's frame and guards alone, to
scale this CPU's figures to another host's; ``dynamo_runner``, the runner returned to Dynamo by a backend and
called through ``torch.compile`` (its code then runs after Dynamo's, as in a real call, colder than in a loop
of its own), and ``dynamo_fixed``, the same function with a fixed output: their difference is what grace
costs inside a compiled call. Figures are medians of ``--rounds`` raw samples (each the mean of
``--calls`` calls), the steps sampled in a seeded random order per round; ``--json`` prints one line with the
raw samples.

usage: python scripts/bench_steady_call.py [--static 0] [--rounds 15] [--calls 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.mutation_guard import GenerationTracker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import fakes
from host_layers import fixed_output_backend  # Dynamo's floor as the GPU scripts take it
from runner_steps import steady_steps, time_steps  # the same steps and timing as the GPU script

from grace.options import GraceOptions
from grace.pi import plan as pi_plan
from grace.runner import GraceRunner, RunnerPlan
from grace.scg import Variant


class _ValuesTable:
    """Stands in for the device pointer table: keeps the values, writes only when they change."""

    def __init__(self) -> None:
        self.values: tuple[int, ...] = ()

    def write(self, values: Sequence[int]) -> bool:
        current = tuple(values)
        if current == self.values:
            return False
        self.values = current
        return True


def _runner(static: int, mp: pytest.MonkeyPatch) -> tuple[GraceRunner, list[torch.Tensor]]:
    """A runner whose one slot replays a PI graph, called until steady."""
    params = [torch.randn(16) for _ in range(static)]
    args = [torch.randn(1024), *params]
    static_indices = tuple(range(1, 1 + static))

    def make(facts: Any, call_args: Sequence[Any]) -> Any:
        plan = pi_plan.PiPlan(
            _ValuesTable(), [pi_plan.Slot(0, 0, 16)], {0: 0x1000}, (0,), {}, pi_plan.StageLog()
        )
        return fakes.captured_graph(
            fakes.CountingReplay(),
            placeholders={0: torch.empty(1024)},
            outputs=[torch.empty(1024)],
            output_container="single",
            static_indices=static_indices,
            static_ptrs=[None, *(p.data_ptr() for p in params)],
            pi_plan=plan,
            borrowed=True,
        )

    fakes.cpu_warmup(mp)
    fakes.use_decide(mp, fakes.decides_graph(make, Variant.GRAPH_PI))
    # CPU tensors stand for CUDA ones: gathering their addresses is the same work.
    mp.setattr(pi_plan, "device_addresses", lambda values: [v.data_ptr() for v in values])
    plan = RunnerPlan(
        graph_hash="steady",
        device=torch.device("cpu"),
        static_indices=static_indices,
        dynamic_indices=(0,),
        scalar_indices=(),
    )
    runner = GraceRunner(lambda *a: a[0] * 2, plan, GraceOptions(), None)
    for _ in range(20):
        GenerationTracker.generation += 1
        runner(*args)
    return runner, args


def _dynamo_floor() -> Callable[[], Any]:
    from suites.workloads import get

    model, inputs = get("seed_elementwise_1m").factory("standard")(torch.device("cpu"), torch.float32)
    compiled = torch.compile(model, backend=fixed_output_backend)
    for _ in range(5):
        compiled(*inputs)
    return lambda: compiled(*inputs)


def _through_dynamo(args: Sequence[Any], returns: Callable[..., Any]) -> Callable[[], Any]:
    """A call as Dynamo makes it: ``torch.compile`` of a function of ``args`` whose backend returns
    ``returns`` (the runner, so that its code runs where it runs in a real call, after Dynamo's frame and
    guards; or a fixed output, Dynamo's floor for the same function)."""

    def uses_every_input(*tensors: torch.Tensor) -> torch.Tensor:
        out = tensors[0] * 2
        for t in tensors[1:]:
            out = out + t.sum()
        return out

    compiled = torch.compile(uses_every_input, backend=lambda gm, example_inputs: returns)
    for _ in range(5):
        compiled(*args)
    return lambda: compiled(*args)


def bench(static: int, rounds: int, calls: int, seed: int = 0) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        runner, args = _runner(static, mp)
        steps = {
            **steady_steps(runner, args, launch=False),
            "dynamo_floor": _dynamo_floor(),
            "dynamo_fixed": _through_dynamo(args, lambda *a: a[0]),
            "dynamo_runner": _through_dynamo(args, runner),
        }
        timed = time_steps(runner, steps, rounds, calls, random.Random(seed))
    return {
        "static_inputs": static,
        "rounds": rounds,
        "calls_per_sample": calls,
        "torch": torch.__version__,
        **timed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--static", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(argv)
    if ns.static < 0 or ns.rounds < 1 or ns.calls < 1:
        parser.error("--static must be at least 0, --rounds and --calls must be positive")
    result = bench(ns.static, ns.rounds, ns.calls)
    if ns.json:
        print(json.dumps(result))
        return 0
    print(
        f"{ns.static} static inputs, torch {result['torch']}, median of {ns.rounds} samples "
        f"({result['runner_calls_replayed']} of {result['runner_calls']} runner calls replayed):"
    )
    for name, value in result["median_us"].items():
        print(f"  {name:<22}{value:9.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
