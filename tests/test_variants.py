"""The variant registry (grace.variants): a new graph variant costs one enum value and one spec class.

A toy variant registered next to the two built-in ones is captured, checked against the no-graph
reference, chosen, replayed in steady calls and reported, with no change to the runner, the deciding
call, the stats or the report; a toy that fails its check is dropped like any variant. On CPU with the
shared fakes (tests/fakes.py)."""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import fakes
import pytest
import torch

import grace.slot
import grace.variants
from grace import stats
from grace.capture import CapturedGraph
from grace.options import GraceOptions
from grace.runner import GraceRunner, RunnerPlan
from grace.runplan import SlotFacts
from grace.scg import Variant, uses_graph
from grace.variants import REGISTRY, VariantSpec, register, unregister


class ToyVariant(str, enum.Enum):  # the one enum value
    GRAPH_TOY = "graph_toy"


class ToySpec(VariantSpec):  # the one spec class
    """A graph captured like the graph with copies, replayed with copies, preferred when not timed."""

    variant = ToyVariant.GRAPH_TOY  # type: ignore[assignment]
    check_rank = 2
    preference = -1
    wrong = False

    def __init__(self) -> None:
        self.replays = 0

    def capture(
        self, facts: SlotFacts, args: Sequence[Any], before: Mapping[Variant, CapturedGraph]
    ) -> CapturedGraph | None:
        plan = facts.plan
        return grace.variants.capture_graph(
            facts.compiled,
            args,
            device=facts.device,
            dynamic_indices=plan.dynamic_indices,
            static_indices=plan.static_indices,
            mutated_indices=list(facts.mutated),
        )

    def replay(self, graph: CapturedGraph, args: Sequence[Any], clone: bool) -> Any:
        self.replays += 1
        out = graph.run_with_copies(args, clone)
        return tuple(o + 1 for o in out) if self.wrong else out


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[ToySpec]:
    spec = ToySpec()
    register(spec)
    fakes.cpu_warmup(monkeypatch)
    monkeypatch.setattr(grace.variants, "capture_graph", fakes.fake_capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    counter = itertools.count(1)
    monkeypatch.setattr(grace.slot.torch_compat, "compiled_call_generation", lambda: next(counter))
    stats.forget_all()
    yield spec
    unregister(ToyVariant.GRAPH_TOY)  # type: ignore[arg-type]
    stats.forget_all()


def _runner() -> GraceRunner:
    plan = RunnerPlan(
        "h", device=torch.device("cpu"), static_indices=(), dynamic_indices=(0,), scalar_indices=()
    )
    options = GraceOptions(scg=False, pi=False, persist_decisions=False)
    return GraceRunner(lambda x: (x * 2,), plan, options, None)


def test_a_registered_toy_variant_is_checked_chosen_replayed_and_reported(toy: ToySpec) -> None:
    runner = _runner()
    for k in range(5):  # warm-up, deciding call, steady calls at new addresses
        x = torch.full((4,), float(k))
        (out,) = runner(x)
        torch.testing.assert_close(out, x * 2)
    (slot,) = runner.slots.values()
    assert slot.record.variant == ToyVariant.GRAPH_TOY and slot.spec is toy
    assert slot.decision is not None
    assert slot.decision.numeric_checks == {
        "no_graph": "reference",
        "graph_copies": "pass",
        "graph_toy": "pass",
    }
    assert toy.replays >= 4  # its check, the deciding call's replay and the steady calls
    (record,) = stats.snapshot()
    assert record["variant"] == "graph_toy" and record["steady_graph_launches_per_call"] == 1
    assert uses_graph(record["variant"]) and list(REGISTRY)[-1] == ToyVariant.GRAPH_TOY


def test_a_toy_variant_that_fails_its_check_is_dropped(toy: ToySpec) -> None:
    toy.wrong = True
    runner = _runner()
    for k in range(3):
        x = torch.full((4,), float(k))
        (out,) = runner(x)
        torch.testing.assert_close(out, x * 2)
    (slot,) = runner.slots.values()
    assert slot.record.variant == Variant.GRAPH_COPIES
    assert slot.decision is not None and "max abs difference" in slot.decision.numeric_checks["graph_toy"]
    assert "numeric_mismatch" in {r.code.value for r in slot.record.skip_reasons}
