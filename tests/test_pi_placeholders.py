"""Note: [Placeholders PI serves] (grace.variants) on CPU, with the fake capture of test_decide: a PI
graph captured with the copies graph's placeholders drops them once bound when its plan serves every
input, keeps them when one input is read at its capture address, and gets placeholders of its own when
a later call's input cannot be served, so that no replay reads memory it let go."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch
from test_decide import (  # the autouse fixtures apply here too
    FakePlan,
    Setup,
    _inputs,
    clean_stats,  # noqa: F401
    each_run_is_a_compiled_call,  # noqa: F401
)

from grace.runner import GraphSlot
from grace.scg import Variant


class FailingPlan(FakePlan):
    """A plan that serves every input unless ``failing`` is set: then ``update`` returns False and
    there is no table, so the fake replay reads the graph's placeholders (``test_decide._reads``)."""

    def __init__(self, placeholders: Mapping[int, torch.Tensor], uncovered: tuple[int, ...]) -> None:
        super().__init__(placeholders, stuck=False, uncovered=uncovered)
        self.failing = False
        self.rebased: list[dict[int, int]] = []

    def update(self, inputs: Sequence[Any]) -> bool:
        if self.failing:
            self.table = None  # type: ignore[assignment]
            return False
        return super().update(inputs)

    def rebase_placeholders(self, addresses: dict[int, int]) -> None:
        self.rebased.append(dict(addresses))


class PlanSetup(Setup):
    def __init__(self, monkeypatch: pytest.MonkeyPatch, uncovered: tuple[int, ...] = ()) -> None:
        super().__init__(monkeypatch)
        self.uncovered = uncovered

    def prepare(self, ctx: Any) -> FakePlan:
        self.plans.append(FailingPlan(ctx.placeholders, self.uncovered))
        return self.plans[-1]


def _decided_pi(setup: PlanSetup) -> tuple[GraphSlot, FailingPlan]:
    slot = setup.slot(scg=False, pi_direct=False)
    args = _inputs()
    (out,) = slot.decide(args)
    torch.testing.assert_close(out, args[0] * 2 + args[1])
    assert slot.record.variant == Variant.GRAPH_PI and slot.graph is not None
    plan = slot.graph.pi_plan
    assert isinstance(plan, FailingPlan)
    return slot, plan


def test_a_pi_graph_serving_every_input_drops_its_placeholders(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = PlanSetup(monkeypatch)
    slot, _ = _decided_pi(setup)
    graph = slot.graph
    assert graph is not None and graph.borrowed and graph.placeholders == {}
    for scale in (1.0, 3.0, -2.0):  # other addresses and values: read through the table
        x, y = (t * scale for t in _inputs())
        (out,) = slot.run([x, y])
        torch.testing.assert_close(out, x * 2 + y)
    assert slot.record.variant == Variant.GRAPH_PI


def test_a_call_pi_cannot_serve_gets_new_placeholders_before_the_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = PlanSetup(monkeypatch)
    slot, plan = _decided_pi(setup)
    graph = slot.graph
    assert graph is not None and graph.borrowed
    plan.failing = True
    x, y = (t + 5.0 for t in _inputs())  # new values: a replay of dropped placeholders would be stale
    (out,) = slot.run([x, y])
    torch.testing.assert_close(out, x * 2 + y)
    assert not graph.borrowed and sorted(graph.placeholders) == [0, 1]
    assert plan.rebased == [{i: int(p.data_ptr()) for i, p in graph.placeholders.items()}]


def test_a_pi_graph_with_an_input_read_at_its_capture_address_keeps_its_placeholders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = PlanSetup(monkeypatch, uncovered=(1,))
    slot, _ = _decided_pi(setup)
    graph = slot.graph
    assert graph is not None and not graph.borrowed and sorted(graph.placeholders) == [0, 1]
