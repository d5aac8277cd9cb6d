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

from grace.capture import CaptureError
from grace.reasons import SkipCode, SkipReason
from grace.runner import GraphSlot
from grace.scg import Variant


class FailingPlan(FakePlan):
    """A plan that serves every input but the ``uncovered`` ones (read from their placeholders at
    capture) unless ``failing`` is set: then ``update`` returns False and there is no table, so the
    fake replay reads the graph's placeholders (``test_decide._reads``)."""

    def __init__(self, placeholders: Mapping[int, torch.Tensor], uncovered: tuple[int, ...]) -> None:
        super().__init__(placeholders, stuck=False, uncovered=uncovered)
        self.failing = False
        self.rebased: list[dict[int, int]] = []

    def update(self, inputs: Sequence[Any]) -> bool:
        if self.failing:
            self.table = None  # type: ignore[assignment]
            return False
        served = super().update(inputs)
        for i in self.uncovered:  # read at the capture address: the placeholder, copied into each call
            self.table[i] = self.placeholders[i]
        return served

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


def test_a_pi_graph_with_an_input_read_at_its_capture_address_keeps_that_inputs_placeholder_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Input 1 is read at its capture address (its placeholder's): it keeps that placeholder and is
    copied into it every call; input 0, which the plan serves, drops its own, and calls at other
    addresses make it no new one."""
    setup = PlanSetup(monkeypatch, uncovered=(1,))
    slot, plan = _decided_pi(setup)
    graph = slot.graph
    assert graph is not None and graph.borrowed and sorted(graph.placeholders) == [1]
    for scale in (1.0, 3.0, -2.0):
        x, y = (t * scale for t in _inputs())
        (out,) = slot.run([x, y])
        torch.testing.assert_close(out, x * 2 + y)
    assert sorted(graph.placeholders) == [1] and plan.rebased == []


class UnborrowableSetup(PlanSetup):
    """Inputs the capture cannot borrow (as two views of one storage are): a capture on the caller's
    inputs is refused the way grace.capture refuses it; ``stuck`` plans never rewrite their table."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, uncovered: tuple[int, ...] = (), stuck: bool = False):
        super().__init__(monkeypatch, uncovered)
        self.stuck_plans = stuck

    def prepare(self, ctx: Any) -> FakePlan:
        plan = super().prepare(ctx)
        plan.stuck = self.stuck_plans
        return plan

    def capture(self, fn: Any, args: Sequence[Any], **kwargs: Any) -> Any:
        if kwargs.get("borrow_inputs"):
            raise CaptureError(SkipReason(SkipCode.PI_DIRECT_DECLINED, "inputs 0 and 1 share a storage"))
        return super().capture(fn, args, **kwargs)


def _decided_direct(setup: Setup) -> GraphSlot:
    slot = setup.slot(scg=False, pi_direct=True)
    args = _inputs()
    (out,) = slot.decide(args)
    torch.testing.assert_close(out, args[0] * 2 + args[1])
    return slot


def test_inputs_that_cannot_be_borrowed_get_one_pi_graph_on_its_own_placeholders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Note: [A PI graph alone]: one capture (no graph with copies beside it), checked at new addresses
    on its own placeholders, kept, and its placeholders let go once bound."""
    setup = UnborrowableSetup(monkeypatch)
    slot = _decided_direct(setup)
    assert setup.borrowed == [False] and len(setup.plans) == 1
    assert slot.record.variant == Variant.GRAPH_PI and slot.graph is not None and slot.graph.borrowed
    assert slot.decision is not None and slot.decision.numeric_checks["graph_pi"] == "pass"
    on_placeholders = {i: p.data_ptr() for i, p in setup.captured[0].items()}
    assert on_placeholders in setup.plans[0].updates  # the check with the inputs elsewhere
    assert any(r.code is SkipCode.PI_DIRECT_DECLINED for r in slot.record.skip_reasons)
    x, y = (t * 3.0 for t in _inputs())
    (out,) = slot.run([x, y])
    torch.testing.assert_close(out, x * 2 + y)


def test_a_failing_pi_graph_alone_is_followed_by_the_graph_with_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = UnborrowableSetup(monkeypatch, stuck=True)
    slot = _decided_direct(setup)
    assert setup.borrowed == [False, False] and len(setup.plans) == 1  # PI alone, then copies
    assert slot.record.variant == Variant.GRAPH_COPIES
    assert slot.decision is not None and "max abs difference" in slot.decision.numeric_checks["graph_pi"]


def test_a_pi_graph_alone_that_would_copy_an_input_gives_way_to_the_usual_pair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = UnborrowableSetup(monkeypatch, uncovered=(1,))
    slot = _decided_direct(setup)
    assert setup.borrowed == [False, False, False]  # PI alone (released), copies, PI on its placeholders
    assert setup.plans[0].released and len(setup.plans) == 2
    copies, pi = setup.captured[1], setup.captured[2]
    assert all(pi[i] is copies[i] for i in copies)
    assert slot.record.variant == Variant.GRAPH_PI
