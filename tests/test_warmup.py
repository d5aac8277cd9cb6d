"""Note: [Captures of a step in one step] in grace.warmup: training graphs in a step's pool warm up for
whole steps, so that every capture of the pool happens in one step, in the order the step runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import fakes
import pytest
import torch

import grace.warmup
from grace.compat.aot import GraphRole
from grace.decide import SlotDecision
from grace.options import GraceOptions
from grace.runner import GraceRunner, RunnerPlan
from grace.warmup import Warmup


def _generations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    generation = [1]
    monkeypatch.setattr(grace.warmup.torch_compat, "compiled_call_generation", lambda: generation[0])
    return generation


def test_by_step_every_call_of_the_warm_up_step_warms_up(monkeypatch: pytest.MonkeyPatch) -> None:
    generation = _generations(monkeypatch)
    warmup = Warmup(1, by_step=True)
    assert [warmup.decides_now() for _ in range(4)] == [False] * 4  # four layers in the first step
    generation[0] = 2
    assert warmup.decides_now()  # the first call of the next step decides


def test_by_call_the_second_call_decides_whatever_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    _generations(monkeypatch)
    warmup = Warmup(1)
    assert [warmup.decides_now() for _ in range(3)] == [False, True, True]


def test_two_warm_up_steps_and_calls_made_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    generation = _generations(monkeypatch)
    warmup = Warmup(2, by_step=True)
    assert not warmup.decides_now() and not warmup.decides_now()
    generation[0] = 2
    assert not warmup.decides_now()  # the second warm-up step
    generation[0] = 3
    assert warmup.decides_now()
    elsewhere = Warmup(1, by_step=True)
    elsewhere.skip(3)  # calls with these shapes on another device, in earlier steps
    assert elsewhere.decides_now()
    elsewhere.finish()
    assert elsewhere.decides_now() and elsewhere.left == 0


def test_a_step_that_never_ends_still_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    _generations(monkeypatch)
    monkeypatch.setattr(grace.warmup, "_MAX_CALLS_IN_ONE_STEP", 3)
    warmup = Warmup(1, by_step=True)
    assert [warmup.decides_now() for _ in range(5)] == [False, False, False, True, True]


@pytest.mark.parametrize("step_pool", [True, False])
def test_a_layer_graph_in_the_step_pool_decides_in_the_second_step(
    monkeypatch: pytest.MonkeyPatch, step_pool: bool
) -> None:
    """Through the runner: a training forward called for four layers a step decides at the first call of
    the second step with ``step_pool``, at its second call (the first step's second layer) without."""
    generation = _generations(monkeypatch)
    decided: list[int] = []

    def decide(facts: Any, args: Sequence[Any]) -> SlotDecision:
        decided.append(generation[0])
        return fakes.decides_no_graph(facts, args)

    fakes.cpu_warmup(monkeypatch)
    fakes.use_decide(monkeypatch, decide)
    indices: dict[str, Any] = {"static_indices": (), "dynamic_indices": (0,), "scalar_indices": ()}
    plan = RunnerPlan("h", torch.device("cpu"), **indices, role=GraphRole.FORWARD)
    runner = GraceRunner(lambda x: [x * 2], plan, GraceOptions(step_pool=step_pool), None)
    for step in (1, 2):
        generation[0] = step
        for _ in range(4):
            (out,) = runner(torch.ones(3))
            torch.testing.assert_close(out, torch.full((3,), 2.0))
    assert decided == ([2] if step_pool else [1])
