"""How many of a slot's output sets a steady training call asks about (Note: [Output sets] in
grace.outputsets): one compiled layer serves every layer of a step, so its forward keeps a set per layer,
each held by the saved tensors of its layer until the step's end. A call must find the free set without
walking the sets this step already took (pools of their own: least recently kept first), and never ask
twice about one set (the set it picked is replayed as picked). Every value is checked against eager."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import fakes
import pytest
import torch

import grace.runplan
import grace.slot
from grace import poolgroups
from grace.compat.aot import GraphRole
from grace.graph import CapturedGraph
from grace.options import GraceOptions
from grace.runner import GraceRunner, RunnerPlan

CPU = torch.device("cpu")
LAYERS = 8
STEPS = 5


def _layer(x: torch.Tensor) -> list[torch.Tensor]:
    return [x * 2 + 1, x + 3]  # the result, and a tensor the step keeps until its end (a saved tensor)


def _capture() -> Any:
    """Fake captures of ``_layer``: their replay computes it from the placeholder into their outputs; in
    a step pool, their footprint is their outputs (as a traced capture's is)."""

    def capture(facts: Any, args: Sequence[Any]) -> Any:
        outputs = [torch.empty_like(args[0]), torch.empty_like(args[0])]
        placeholders = {0: torch.empty_like(args[0])}

        class Replay:
            def replay(self) -> None:
                x = placeholders[0]
                torch.mul(x, 2, out=outputs[0]).add_(1)
                torch.add(x, 3, out=outputs[1])

        graph = fakes.captured_graph(Replay(), placeholders=placeholders, outputs=list(outputs), kept_from=1)
        if facts.pool_group is not None:
            graph.join_pool_group(facts.pool_group, facts.record, graph.output_spans())
        return graph

    return capture


def _asked(monkeypatch: pytest.MonkeyPatch, step_pool: bool) -> list[Counter[int]]:
    """Per steady runner call, how often each set was asked whether its outputs are held."""
    generation = [0]
    fakes.cpu_warmup(monkeypatch)
    fakes.use_decide(monkeypatch, fakes.decides_graph(_capture()))
    monkeypatch.setattr(grace.slot.torch_compat, "compiled_call_generation", lambda: generation[0])
    group = poolgroups.PoolGroup((0, 1))
    monkeypatch.setattr(grace.runplan, "step_group", lambda device: group)
    calls: list[Counter[int]] = []
    original = CapturedGraph.held_outputs

    def counted(graph: CapturedGraph, *args: Any, **kwargs: Any) -> Any:
        if calls:
            calls[-1][id(graph)] += 1
        return original(graph, *args, **kwargs)

    monkeypatch.setattr(CapturedGraph, "held_outputs", counted)
    plan = RunnerPlan(
        "h",
        CPU,
        static_indices=(),
        dynamic_indices=(0,),
        scalar_indices=(),
        role=GraphRole.FORWARD,
        kept_from=1,
    )
    runner = GraceRunner(_layer, plan, GraceOptions(step_pool=step_pool), None)
    for step in range(STEPS):
        h, saved = torch.full((4,), float(step)), []
        for _ in range(LAYERS):
            generation[0] += 1
            if step >= 3:
                calls.append(Counter())
            out = runner(h)
            expected = _layer(h)
            for got, want in zip(out, expected, strict=True):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
            h = out[0].clone()
            saved.append(out[1])
        del saved, out  # the step's end: the saved tensors die
    return calls


def test_pools_of_their_own_find_the_free_set_without_walking_the_steps_taken_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _asked(monkeypatch, step_pool=False)
    assert len(calls) == 2 * LAYERS
    asked = [sum(c.values()) for c in calls]
    # The slot's graph (held by the layer before), then the least recently kept set: free.
    assert max(asked) <= 2, asked
    assert all(max(c.values()) == 1 for c in calls), calls


def test_a_step_pool_asks_about_each_set_once_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _asked(monkeypatch, step_pool=True)
    assert len(calls) == 2 * LAYERS
    assert all(max(c.values()) == 1 for c in calls), calls
