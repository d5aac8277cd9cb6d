"""A training graph run without its CUDA graph frees its inputs as it goes (grace.boxing).

AOTAutograd hands a backward its saved tensors in one list that Inductor's code empties, dropping each
tensor after its last read. Through grace's installed entry the list reaches Inductor's code only on
the paths that end with that run (no graph, outputs held); elsewhere the inputs stay whole. Each
fake entry here behaves as Inductor's does (empties its list) and counts, right after, how many of its
inputs are still alive: a tensor only the call holds dies there exactly when no grace frame kept it.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import fakes
import pytest
import torch

import grace.slot
from grace import stats
from grace.boxing import Consuming, Inputs, run
from grace.compat.aot import GraphRole
from grace.guard import CountedCallable, GuardedRunner, SafePath
from grace.options import GraceOptions
from grace.philox import host_seeds
from grace.runner import GraceRunner, RunnerPlan
from grace.training import boxed

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("fresh_pool_groups")  # grace.stats emptied around each test


class InductorEntry:
    """Inductor's compiled entry as grace sees it: one list in, emptied; ``alive``, per run, how many
    of its inputs something other than the list still held once it was emptied."""

    def __init__(self) -> None:
        self.alive: list[int] = []

    def __call__(self, inputs: list[Any]) -> list[torch.Tensor]:
        refs = [weakref.ref(t) for t in inputs]
        out = [inputs[0] * 2, inputs[1] + 1]
        inputs.clear()
        self.alive.append(sum(ref() is not None for ref in refs))
        return out


def _entry(monkeypatch: pytest.MonkeyPatch, decide: Any, generation: list[int]) -> tuple[Any, InductorEntry]:
    """The entry grace installs for a backward with two dynamic inputs, built as the backend builds it."""
    fakes.cpu_warmup(monkeypatch)
    fakes.use_decide(monkeypatch, decide)
    monkeypatch.setattr(grace.slot.torch_compat, "compiled_call_generation", lambda: generation[0])
    inductor = InductorEntry()
    compiled = Consuming(inductor)
    counted = CountedCallable(host_seeds(compiled, ()))
    plan = RunnerPlan(
        "h",
        CPU,
        static_indices=(),
        dynamic_indices=(0, 1),
        scalar_indices=(),
        role=GraphRole.BACKWARD,
        kept_from=0,
    )
    runner = GraceRunner(counted, plan, GraceOptions(max_output_sets=1), None)
    return boxed(GuardedRunner(runner, SafePath(counted, None, compiled))), inductor


def _saved() -> list[torch.Tensor]:
    return [torch.ones(2, 3), torch.full((2, 3), 2.0)]


def test_a_backward_without_a_graph_frees_its_saved_tensors_as_inductor_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Warm-up and the deciding call keep the inputs whole (they read them after the run); a slot
    without a graph hands its list to Inductor's code, and no grace frame holds the saved tensors."""
    entry, inductor = _entry(monkeypatch, fakes.decides_no_graph, [1])
    for _ in range(4):
        out = entry(_saved())
        torch.testing.assert_close(out[0], torch.full((2, 3), 2.0))
        torch.testing.assert_close(out[1], torch.full((2, 3), 3.0))
    assert inductor.alive == [2, 2, 0, 0]


def test_a_backward_whose_gradients_are_held_runs_without_its_graph_and_frees_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Gradient accumulation: the graph's last gradients are held, so the call runs without the graph,
    and that run takes the list too."""
    generation = [1]
    own = [torch.zeros(2, 3), torch.zeros(2, 3)]

    def capture(facts: Any, args: Sequence[Any]) -> Any:
        placeholders = {0: torch.zeros(2, 3), 1: torch.zeros(2, 3)}

        class Writes:
            def replay(self) -> None:
                own[0].copy_(placeholders[0] * 2)
                own[1].copy_(placeholders[1] + 1)

        return fakes.captured_graph(Writes(), placeholders=placeholders, outputs=list(own), kept_from=0)

    entry, inductor = _entry(monkeypatch, fakes.decides_graph(capture), generation)
    entry(_saved())  # warm-up
    grads = entry(_saved())  # the deciding call: the graph's replay
    generation[0] = 2
    again = entry(_saved())  # ``grads`` still held: no replay over them
    torch.testing.assert_close(grads[0], torch.full((2, 3), 2.0))
    torch.testing.assert_close(again[1], torch.full((2, 3), 3.0))
    (record,) = stats.snapshot()
    assert record["held_output_calls"] == 1
    assert inductor.alive == [2, 0]


def test_only_inputs_handed_over_are_emptied() -> None:
    inductor = InductorEntry()
    compiled = CountedCallable(host_seeds(Consuming(inductor), (0,)))  # the seeds' wrapper passes it on
    kept = (torch.ones(1), torch.ones(1))
    run(compiled, kept)  # a tuple: Inductor gets a list of its own
    plain = [torch.ones(1), torch.ones(1)]
    run(compiled, plain)
    handed = Inputs([torch.ones(1), torch.ones(1)])
    run(compiled, handed)
    assert len(plain) == 2 and handed == [] and inductor.alive == [2, 2, 0] and compiled.calls == 3


def test_a_failed_run_that_took_the_inputs_is_not_run_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard's safe path reruns a call grace's code failed, but never one whose inputs a run took."""
    runs: list[int] = []

    def failing(inputs: list[Any]) -> Any:
        runs.append(len(inputs))
        inputs.clear()
        raise RuntimeError("out of memory")

    compiled = Consuming(failing)
    counted = CountedCallable(compiled)
    plan = RunnerPlan(
        "h", CPU, static_indices=(), dynamic_indices=(0,), scalar_indices=(), role=GraphRole.BACKWARD
    )
    monkeypatch.setattr(GraceRunner, "run", lambda self, args: run(self.compiled, args))
    runner = GraceRunner(counted, plan, GraceOptions(), None)
    entry = boxed(GuardedRunner(runner, SafePath(counted, None, compiled)))
    with pytest.raises(RuntimeError, match="out of memory"):
        entry([torch.ones(1)])
    assert runs == [1]
