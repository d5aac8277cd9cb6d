"""The deciding call (grace.decide) on CPU, with a fake capture: the PI graph reads the copies graph's
placeholders, PI's new-address check runs on those placeholders instead of clones of the inputs, a PI
graph that keeps reading its placeholders is rejected even when they hold the inputs' values, and
no reference output is alive while the variants are timed. The fake graphs replay by calling the
callable on what they read (placeholders, or the fake plan's table); no CUDA is involved."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import fakes
import pytest
import torch
from fakes import ReplaysCallable

import grace.choice
import grace.decide
import grace.variants
from grace import stats
from grace.capture import CapturedGraph, placeholders_for
from grace.options import GraceOptions
from grace.pi_contract import PlanDefaults
from grace.runner import GraceRunner, GraphSlot, RunnerPlan
from grace.scg import DecisionSource, Variant


class FakePlan(PlanDefaults):
    """A PI plan whose table maps input index -> the tensor the graph reads; ``stuck`` never rewrites it
    (the graph keeps reading the placeholders, as a patch that did not take would)."""

    def __init__(
        self, placeholders: Mapping[int, torch.Tensor], stuck: bool, uncovered: tuple[int, ...] = ()
    ) -> None:
        self.placeholders = dict(placeholders)
        self.table = dict(placeholders)
        self.stuck = stuck
        self.uncovered = uncovered
        self.uncovered_reasons = dict.fromkeys(uncovered, "a memcpy node reads it")
        self.updates: list[dict[int, int]] = []
        self.released = False

    @property
    def uncovered_indices(self) -> tuple[int, ...]:
        return self.uncovered

    def release(self) -> None:
        self.released = True

    @property
    def bytes_per_replay(self) -> int:
        return 8 * len(self.table)

    @property
    def stages(self) -> list[tuple[str, str, str]]:
        return [("patch", "ok", "fake")]

    def update(self, inputs: Sequence[Any]) -> bool:
        self.updates.append({i: inputs[i].data_ptr() for i in self.placeholders})
        if not self.stuck:
            self.table = {i: inputs[i] for i in self.placeholders}
        return True


def _reads(owner: CapturedGraph) -> Mapping[int, torch.Tensor] | None:
    """What a graph with a ``FakePlan`` reads: the plan's table (else its placeholders)."""
    plan = owner.pi_plan
    return plan.table if isinstance(plan, FakePlan) else None


class Setup:
    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        stuck: bool = False,
        uncovered_when_borrowed: tuple[int, ...] = (),
    ) -> None:
        self.captured: list[dict[int, torch.Tensor]] = []
        self.borrowed: list[bool] = []
        self.plans: list[FakePlan] = []
        self.compiled_outputs: list[weakref.ref[torch.Tensor]] = []
        self.stuck = stuck
        self.uncovered_when_borrowed = uncovered_when_borrowed
        monkeypatch.setattr(grace.variants, "capture_graph", self.capture)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)

    def compiled(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        out = x * 2 + y
        self.compiled_outputs.append(weakref.ref(out))
        return (out,)

    def prepare(self, ctx: Any) -> FakePlan:
        uncovered = self.uncovered_when_borrowed if self.borrowed[-1] else ()
        self.plans.append(FakePlan(ctx.placeholders, self.stuck, uncovered))
        return self.plans[-1]

    def capture(
        self,
        fn: Any,
        args: Sequence[Any],
        *,
        device: torch.device,
        dynamic_indices: Sequence[int],
        static_indices: Sequence[int],
        mutated_indices: Sequence[int],
        hooks: Sequence[Any] = (),
        placeholders: Mapping[int, torch.Tensor] | None = None,
        borrow_inputs: bool = False,
        keep_pristine: bool = False,
        kept_from: int | None = None,
        pool_group: Any = None,
        pool_kin: Any = None,
    ) -> CapturedGraph:
        if borrow_inputs:
            held = {i: args[i] for i in dynamic_indices}
        else:
            held = placeholders_for(args, dynamic_indices, placeholders)
            if placeholders is None:  # memory that happens to hold the inputs' values (reused from them)
                for i, p in held.items():
                    p.copy_(args[i])
        self.captured.append(held)
        self.borrowed.append(borrow_inputs)
        for hook in hooks:
            hook(0x1000 + len(self.captured), held)
        graph = ReplaysCallable(self.compiled, args, _reads)
        outputs = [torch.empty_like(o) for o in self.compiled(*args)]
        captured = fakes.captured_graph(
            graph,
            placeholders=held,
            outputs=outputs,
            output_container="tuple",
            static_indices=tuple(static_indices),
            static_ptrs=[None] * len(args),
            borrowed=borrow_inputs,
            count_outputs=False,
        )
        graph.owner = captured
        return captured

    def slot(self, **options: Any) -> GraphSlot:
        plan = RunnerPlan(
            graph_hash="h",
            device=torch.device("cpu"),
            static_indices=(),
            dynamic_indices=(0, 1),
            scalar_indices=(),
            pi_prepare=self.prepare,
        )
        values: dict[str, Any] = {"persist_decisions": False}
        values.update(options)
        runner = GraceRunner(self.compiled, plan, GraceOptions(**values), None)
        return GraphSlot(runner, "sig")


@pytest.fixture(autouse=True)
def clean_stats() -> Iterator[None]:
    stats.forget_all()
    yield
    stats.forget_all()


@pytest.fixture(autouse=True)
def each_run_is_a_compiled_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``slot.run`` here stands for a call of a compiled model (Dynamo counts them): a new
    generation each time, so Note: [Outputs held within one call] never applies."""
    import itertools

    import grace.slot

    counter = itertools.count(1)
    monkeypatch.setattr(grace.slot.torch_compat, "compiled_call_generation", lambda: next(counter))


def _inputs() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(64), torch.randn(64)]


def _decided(setup: Setup, **tolerance: Any) -> GraphSlot:
    """A slot of ``setup`` (no timing, no direct PI graph) after its deciding call on ``_inputs()``,
    whose output is checked against ``x * 2 + y`` (within ``tolerance``: assert_close's by default)."""
    slot = setup.slot(scg=False, pi_direct=False)
    args = _inputs()
    (out,) = slot.decide(args)
    torch.testing.assert_close(out, args[0] * 2 + args[1], **tolerance)
    return slot


def test_pi_graph_is_captured_against_the_copies_graph_placeholders(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = Setup(monkeypatch)
    slot = _decided(setup)
    copies, pi = setup.captured
    assert set(copies) == set(pi) == {0, 1}
    assert all(pi[i] is copies[i] for i in copies)  # one set of placeholders for both graphs
    assert slot.record.variant == Variant.GRAPH_PI
    # bound, it serves every input through its table and lets them go (Note: [Placeholders PI serves])
    assert slot.graph is not None and slot.graph.borrowed and slot.graph.placeholders == {}


def test_pi_new_address_check_runs_on_the_placeholders_not_on_clones(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = Setup(monkeypatch)
    slot = setup.slot(scg=False, pi_direct=False)
    args = _inputs()
    slot.decide(args)
    (plan,) = setup.plans
    on_args = {i: a.data_ptr() for i, a in enumerate(args)}
    on_placeholders = {i: p.data_ptr() for i, p in setup.captured[0].items()}
    # the check's run, the run at new addresses, the table pointed back at the caller's inputs
    assert plan.updates[:3] == [on_args, on_placeholders, on_args]
    assert slot.decision is not None and slot.decision.numeric_checks["graph_pi"] == "pass"


def test_a_pi_graph_reading_its_placeholders_fails_although_they_hold_the_inputs_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = Setup(monkeypatch, stuck=True)
    slot = _decided(setup)
    assert slot.decision is not None
    assert "max abs difference" in slot.decision.numeric_checks["graph_pi"]
    assert slot.decision.numeric_checks["graph_copies"] == "pass"
    assert slot.record.variant == Variant.GRAPH_COPIES
    assert "numeric_mismatch" in {r.code.value for r in slot.record.skip_reasons}


def test_no_reference_output_is_alive_while_the_variants_are_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = Setup(monkeypatch)
    alive_when_timed: list[bool] = []

    def time_variants(runs: Mapping[Variant, Any], **kwargs: Any) -> dict[Variant, list[float]]:
        gc.collect()
        alive_when_timed.append(any(ref() is not None for ref in setup.compiled_outputs))
        for run in runs.values():
            run()
        return {v: [1.0 if v == Variant.NO_GRAPH else 2.0] * 3 for v in runs}

    monkeypatch.setattr(grace.choice, "time_variants", time_variants)
    slot = setup.slot()
    args = _inputs()
    (out,) = slot.decide(args)
    assert alive_when_timed == [False]
    assert slot.decision is not None and slot.decision.source == DecisionSource.PROFILED
    assert slot.record.variant == Variant.NO_GRAPH
    torch.testing.assert_close(out, args[0] * 2 + args[1])  # run again: the reference was dropped


def test_without_a_passing_graph_the_reference_itself_is_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = Setup(monkeypatch, stuck=True)

    def broken_copies(args: Sequence[Any], clone: bool) -> Any:
        raise RuntimeError("replay failed on purpose")

    monkeypatch.setattr(CapturedGraph, "run_with_copies", lambda self, a, c: broken_copies(a, c))
    slot = setup.slot(pi_direct=False)
    args = _inputs()
    (out,) = slot.decide(args)
    assert slot.decision is not None and slot.decision.source == DecisionSource.ONLY_CANDIDATE
    reference = setup.compiled_outputs[0]()  # no side effects: the reference runs before the captures
    assert reference is out
    torch.testing.assert_close(out, args[0] * 2 + args[1])


# --- option pi_direct: the PI graph captured on the caller's inputs ---------------------------------


def test_direct_pi_is_one_capture_on_the_inputs_without_placeholders(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = Setup(monkeypatch)
    slot = setup.slot(scg=False, pi_direct=True)
    args = _inputs()
    (out,) = slot.decide(args)
    torch.testing.assert_close(out, args[0] * 2 + args[1])
    assert setup.borrowed == [True]  # no graph with copies was captured
    (held,) = setup.captured
    assert held[0] is args[0] and held[1] is args[1]
    assert slot.record.variant == Variant.GRAPH_PI
    graph = slot.graph
    assert graph is not None and graph.borrowed and graph.placeholders == {}
    assert slot.decision is not None and slot.decision.numeric_checks == {
        "no_graph": "reference",
        "graph_pi": "pass",
    }
    # no new-address run at the decision (there are no placeholders to move to): the runner's check of
    # the first call elsewhere is armed instead
    (plan,) = setup.plans
    assert plan.updates[0] == {i: a.data_ptr() for i, a in enumerate(args)}
    assert slot.verify_ptrs is not None


def test_direct_pi_with_an_input_that_keeps_a_copy_captures_the_two_usual_graphs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = Setup(monkeypatch, uncovered_when_borrowed=(1,))
    slot = setup.slot(scg=False, pi_direct=True)
    args = _inputs()
    (out,) = slot.decide(args)
    torch.testing.assert_close(out, args[0] * 2 + args[1])
    assert setup.borrowed == [True, False, False]
    assert setup.plans[0].released  # the declined plan let go of its table
    declined = [r for r in slot.record.skip_reasons if r.code.value == "pi_direct_declined"]
    assert len(declined) == 1 and "inputs [1] keep a copy" in declined[0].detail
    assert "a memcpy node reads it" in declined[0].detail
    assert slot.record.variant == Variant.GRAPH_PI
    # the graph captured with placeholders is kept; this fake's plan for it serves both inputs, so it lets
    # them go once bound (Note: [Placeholders PI serves]; tests/test_pi_placeholders.py)
    assert slot.graph is not None and slot.graph.pi_plan is setup.plans[-1] and not setup.borrowed[-1]


def test_a_direct_pi_graph_that_fails_its_check_leaves_the_graph_with_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = Setup(monkeypatch)
    slot = setup.slot(scg=False, pi_direct=True)
    args = _inputs()

    def broken(self: FakePlan, inputs: Sequence[Any]) -> bool:  # points the table at the wrong input
        self.updates.append({})
        self.table = {0: inputs[1], 1: inputs[0]}
        return True

    monkeypatch.setattr(FakePlan, "update", broken)
    (out,) = slot.decide(args)
    torch.testing.assert_close(out, args[0] * 2 + args[1])
    assert setup.borrowed == [True, False]
    assert slot.decision is not None
    assert "max abs difference" in slot.decision.numeric_checks["graph_pi"]
    assert slot.decision.numeric_checks["graph_copies"] == "pass"
    assert slot.record.variant == Variant.GRAPH_COPIES


def test_a_stuck_direct_graph_is_caught_by_the_first_call_at_other_addresses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At the capture addresses a stuck graph reads the right values: the decision keeps it, and the
    runner's comparison of the first call elsewhere returns the no-graph result and drops the graph."""
    setup = Setup(monkeypatch, stuck=True)
    slot = setup.slot(scg=False, pi_direct=True)
    args = _inputs()
    slot.decide(args)
    assert slot.record.variant == Variant.GRAPH_PI
    slot.run(args)  # the second verified replay, same addresses
    elsewhere = [a + 1 for a in args]
    (out,) = slot.run(elsewhere)
    torch.testing.assert_close(out, elsewhere[0] * 2 + elsewhere[1])
    assert slot.record.variant == Variant.NO_GRAPH
    assert "numeric_mismatch" in {r.code.value for r in slot.record.skip_reasons}


# --- option host_reference_bytes: large outputs compared with a reference in host memory --------------


def _offload_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stands for grace.hostref.offload on outputs above the threshold (CPU tensors never move)."""
    monkeypatch.setattr(
        grace.decide, "offload", lambda value, min_bytes: (tuple(v.clone() for v in value), True)
    )


def test_large_outputs_are_timed_without_a_graph_before_any_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = Setup(monkeypatch)
    _offload_everything(monkeypatch)
    events: list[Any] = []
    capture = setup.capture

    def logged_capture(*args: Any, **kwargs: Any) -> CapturedGraph:
        events.append("capture")
        return capture(*args, **kwargs)

    def time_variants(runs: Mapping[Variant, Any], **kwargs: Any) -> dict[Variant, list[float]]:
        events.append(tuple(runs))
        for run in runs.values():
            run()
        return {v: [2.0 if v == Variant.NO_GRAPH else 1.0] * 3 for v in runs}

    monkeypatch.setattr(grace.variants, "capture_graph", logged_capture)
    monkeypatch.setattr(grace.choice, "time_variants", time_variants)
    slot = setup.slot(pi_direct=True, scg_copies_bytes=0)
    args = _inputs()
    (out,) = slot.decide(args)
    torch.testing.assert_close(out, args[0] * 2 + args[1])
    assert events == [(Variant.NO_GRAPH,), "capture", (Variant.GRAPH_PI,)]
    assert slot.decision is not None and slot.decision.source == DecisionSource.PROFILED
    assert slot.decision.medians_ms == {"no_graph": 2.0, "graph_pi": 1.0}
    assert slot.record.variant == Variant.GRAPH_PI
    # the returned replay was compared with the host copy: only a move of the inputs is checked later
    assert slot.verify_calls == 0 and slot.verify_ptrs is not None


def test_a_returned_replay_that_differs_from_the_host_reference_drops_the_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = Setup(monkeypatch)
    _offload_everything(monkeypatch)
    replay = ReplaysCallable.replay

    def wrong_from_the_second_replay(self: ReplaysCallable) -> None:
        replay(self)
        if self.replays > 1:
            assert self.owner is not None
            self.owner.outputs[0].add_(1.0)

    monkeypatch.setattr(ReplaysCallable, "replay", wrong_from_the_second_replay)
    slot = setup.slot(scg=False, pi_direct=True)
    args = _inputs()
    (out,) = slot.decide(args)
    torch.testing.assert_close(out, args[0] * 2 + args[1])
    assert slot.decision is not None and slot.decision.numeric_checks["graph_pi"] == "pass"
    assert slot.record.variant == Variant.NO_GRAPH and slot.graph is None
    details = [r.detail for r in slot.record.skip_reasons if r.code.value == "numeric_mismatch"]
    assert len(details) == 1 and "at the deciding call's replay" in details[0]


def test_small_outputs_keep_the_interleaved_timing_and_the_verified_replays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = Setup(monkeypatch)
    timed: list[tuple[Variant, ...]] = []

    def time_variants(runs: Mapping[Variant, Any], **kwargs: Any) -> dict[Variant, list[float]]:
        timed.append(tuple(runs))
        return {v: [2.0 if v == Variant.NO_GRAPH else 1.0] * 3 for v in runs}

    monkeypatch.setattr(grace.choice, "time_variants", time_variants)
    slot = setup.slot(pi_direct=True, scg_copies_bytes=0)
    slot.decide(_inputs())
    assert timed == [(Variant.NO_GRAPH, Variant.GRAPH_PI)]
    assert slot.verify_calls == 1  # the returned replay was the first of two verified ones


def _timed_decision(monkeypatch: pytest.MonkeyPatch, medians: Mapping[Variant, float], **options: Any) -> Any:
    """A slot of a fresh ``Setup`` decided with ``pi_direct`` and SCG on (timings from ``medians``);
    returns the setup, the slot and the variants each timing saw."""
    setup = Setup(monkeypatch)
    timed: list[tuple[Variant, ...]] = []

    def time_variants(runs: Mapping[Variant, Any], **kwargs: Any) -> dict[Variant, list[float]]:
        timed.append(tuple(runs))
        return {v: [medians[v]] * 3 for v in runs}

    monkeypatch.setattr(grace.choice, "time_variants", time_variants)
    slot = setup.slot(pi_direct=True, **options)
    args = _inputs()
    (out,) = slot.decide(args)
    torch.testing.assert_close(out, args[0] * 2 + args[1])
    return setup, slot, timed


def test_small_inputs_time_the_graph_with_copies_beside_a_pi_graph_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Note: [Copies beside a PI graph alone]: the copies graph is captured, checked and timed, and wins
    when it is faster."""
    medians = {Variant.NO_GRAPH: 3.0, Variant.GRAPH_PI: 2.0, Variant.GRAPH_COPIES: 1.0}
    setup, slot, timed = _timed_decision(monkeypatch, medians)
    assert setup.borrowed == [True, False]  # the PI graph on the inputs, then the copies graph
    assert timed == [(Variant.NO_GRAPH, Variant.GRAPH_PI, Variant.GRAPH_COPIES)]
    assert slot.decision is not None
    assert slot.decision.numeric_checks == {
        "no_graph": "reference",
        "graph_pi": "pass",
        "graph_copies": "pass",
    }
    assert slot.record.variant == Variant.GRAPH_COPIES
    assert setup.plans[0].released  # the PI graph lost, and let go of its table


def test_a_pi_graph_alone_that_times_faster_than_copies_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    medians = {Variant.NO_GRAPH: 3.0, Variant.GRAPH_PI: 1.0, Variant.GRAPH_COPIES: 2.0}
    setup, slot, timed = _timed_decision(monkeypatch, medians)
    assert timed == [(Variant.NO_GRAPH, Variant.GRAPH_PI, Variant.GRAPH_COPIES)]
    assert slot.record.variant == Variant.GRAPH_PI and not setup.plans[0].released


def test_inputs_over_the_bound_leave_a_pi_graph_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    medians = {Variant.NO_GRAPH: 3.0, Variant.GRAPH_PI: 2.0, Variant.GRAPH_COPIES: 1.0}
    setup, slot, timed = _timed_decision(monkeypatch, medians, scg_copies_bytes=256)  # inputs: 512 bytes
    assert setup.borrowed == [True] and timed == [(Variant.NO_GRAPH, Variant.GRAPH_PI)]
    assert slot.record.variant == Variant.GRAPH_PI


def test_without_scg_a_pi_graph_alone_gets_no_graph_with_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = Setup(monkeypatch)
    slot = setup.slot(pi_direct=True, scg=False)
    slot.decide(_inputs())
    assert setup.borrowed == [True] and slot.record.variant == Variant.GRAPH_PI


class NoisySetup(Setup):
    """A callable whose runs differ a little (as atomic adds make a backward's): its first run, the
    deciding call's reference, is ``spread`` off every later run, graph or not; a replay of a graph
    captured while ``wrong`` is set is ``wrong`` off as well."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, spread: float, wrong: float = 0.0) -> None:
        super().__init__(monkeypatch)
        self.runs = 0
        self.spread, self.wrong = spread, wrong

    def compiled(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        self.runs += 1
        return (x * 2 + y + (self.spread if self.runs == 1 else 0.0),)

    def replayed(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        (out,) = NoisySetup.compiled(self, x, y)
        return (out + self.wrong,)

    def capture(self, *args: Any, **kwargs: Any) -> CapturedGraph:
        self.compiled = self.replayed  # type: ignore[method-assign]  # what the captured graph replays
        try:
            return super().capture(*args, **kwargs)
        finally:
            del self.compiled


def test_a_callable_with_run_to_run_noise_keeps_its_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note: [Run-to-run noise]: the graph differs from the reference by the callable's own spread, which
    a second no-graph run shows; the graph is kept and the spread recorded."""
    setup = NoisySetup(monkeypatch, spread=1e-3)
    slot = _decided(setup, atol=3e-3, rtol=0)
    assert slot.record.variant in (Variant.GRAPH_PI, Variant.GRAPH_COPIES)
    assert "numeric_noise" in {r.code.value for r in slot.record.skip_reasons}
    assert slot.noise and all(0 < v <= 4 * 2e-3 for v in slot.noise.values())


def test_run_to_run_noise_does_not_excuse_a_wrong_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = NoisySetup(monkeypatch, spread=1e-3, wrong=0.5)
    slot = _decided(setup, atol=3e-3, rtol=0)
    assert slot.record.variant == Variant.NO_GRAPH
    assert "numeric_mismatch" in {r.code.value for r in slot.record.skip_reasons}


class OtherDeviceSetup(Setup):
    """A graph whose replay returns its output on another device than a no-graph run does (as a random
    op's seed is on the GPU only while a stream captures; the meta device stands for it here)."""

    def capture(self, *args: Any, **kwargs: Any) -> CapturedGraph:
        graph = super().capture(*args, **kwargs)
        graph.outputs[:] = [torch.empty_like(o, device="meta") for o in graph.outputs]
        return graph


def test_a_graph_whose_outputs_sit_on_another_device_is_declined(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = OtherDeviceSetup(monkeypatch)
    slot = _decided(setup)
    assert slot.record.variant == Variant.NO_GRAPH
    details = [r.detail for r in slot.record.skip_reasons]
    assert any("output devices differ" in d for d in details), details
