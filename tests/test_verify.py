"""The runner's safety net (grace.verify) on CPU: a kept graph variant is compared with the no-graph
callable on the deciding replay, the first steady call and the first call at new input addresses, and
falls back to no graph with a recorded reason when a replay is wrong. The graph is a fake that replays
from stale addresses the way a broken pointer table would; no CUDA is involved."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch
from fakes import SlotGraph

from grace import stats
from grace.options import GraceOptions
from grace.pi.plan import PiPlan, StageLog
from grace.runner import GraceRunner, GraphSlot, RunnerPlan
from grace.scg import Variant
from grace.verify import check_against_reference


@pytest.fixture(autouse=True)
def clean_stats() -> Iterator[None]:
    stats.forget_all()
    yield
    stats.forget_all()


class Compiled:
    """The no-graph callable: ``x * 2`` and, when asked, ``y += 1`` (counts its runs)."""

    def __init__(self, mutate: bool = False) -> None:
        self.mutate = mutate
        self.runs = 0

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        self.runs += 1
        if self.mutate:
            y.add_(1)
        return (x * 2,)


class FakeGraph(SlotGraph):
    """A kept graph: correct while its inputs stay where they were at capture; once they move it
    replays from the captured tensors (``stale_after_move``), as a table that was not rewritten would."""

    def __init__(self, args: Sequence[Any], mutate: bool, stale_after_move: bool, plan: Any = None) -> None:
        super().__init__(args)
        self.captured = [a for a in args]
        self.mutate = mutate
        self.stale_after_move = stale_after_move
        self.pi_plan = plan
        self.replays = 0
        self.released = False

    def _run(self, args: Sequence[Any], clone: bool) -> tuple[torch.Tensor]:
        self.replays += 1
        x = args[0]
        if self.stale_after_move and x.data_ptr() != self.captured[0].data_ptr():
            x = self.captured[0]
        if self.mutate:
            args[1].add_(1)
        return (x * 2,)

    run_with_pi = _run
    run_with_copies = _run

    def release(self) -> None:
        self.released = True


def _slot(compiled: Compiled, graph: FakeGraph, variant: Variant, **options: Any) -> GraphSlot:
    plan = RunnerPlan(
        graph_hash="h",
        device=torch.device("cpu"),
        static_indices=(),
        dynamic_indices=(0,),
        scalar_indices=(),
        mutated_indices=(1,) if compiled.mutate else (),
    )
    runner = GraceRunner(compiled, plan, GraceOptions(**options), None)
    slot = GraphSlot(runner, "sig")
    slot.bind(variant, graph)  # type: ignore[arg-type]
    return slot


def test_checks_happen_at_the_decision_first_steady_call_and_first_move_only() -> None:
    x = torch.randn(4)
    y = torch.zeros(4)
    compiled = Compiled()
    graph = FakeGraph([x, y], mutate=False, stale_after_move=False)
    slot = _slot(compiled, graph, Variant.GRAPH_PI)
    slot.arm_verification([x, y])
    for _ in range(4):  # deciding replay, first steady call (both checked), two unchecked calls
        (out,) = slot.run([x, y])
        torch.testing.assert_close(out, x * 2)
    assert compiled.runs == 2
    moved = x.clone()
    for _ in range(3):  # the first call at a new address is checked, the rest are not
        (out,) = slot.run([moved, y])
        torch.testing.assert_close(out, moved * 2)
    assert compiled.runs == 3
    other = torch.randn(4)
    slot.run([other, y])
    assert compiled.runs == 3  # once per graph
    assert slot.record.variant == Variant.GRAPH_PI
    assert slot.record.calls == 8 and slot.record.graph_calls == 8
    assert graph.replays == 8


@pytest.mark.parametrize("variant", [Variant.GRAPH_PI, Variant.GRAPH_COPIES])
def test_a_wrong_replay_after_a_move_falls_back_with_a_reason(variant: Variant) -> None:
    x = torch.randn(4)
    y = torch.zeros(4)
    compiled = Compiled()
    graph = FakeGraph([x, y], mutate=False, stale_after_move=True)
    slot = _slot(compiled, graph, variant)
    slot.arm_verification([x, y])
    for _ in range(3):
        (out,) = slot.run([x, y])
        torch.testing.assert_close(out, x * 2)
    moved = torch.randn(4)
    (out,) = slot.run([moved, y])
    torch.testing.assert_close(out, moved * 2)  # the caller gets the no-graph output, not the stale one
    assert slot.record.variant == Variant.NO_GRAPH
    assert graph.released and slot.graph is None
    (reason,) = slot.record.skip_reasons
    assert reason.code.value == "numeric_mismatch"
    assert variant.value in reason.detail and "new addresses" in reason.detail
    (out,) = slot.run([moved, y])
    torch.testing.assert_close(out, moved * 2)


def test_side_effects_apply_once_whether_the_check_passes_or_not() -> None:
    x = torch.randn(4)
    y = torch.zeros(4)
    compiled = Compiled(mutate=True)
    graph = FakeGraph([x, y], mutate=True, stale_after_move=True)
    slot = _slot(compiled, graph, Variant.GRAPH_PI)
    slot.mutated = {1}
    slot.arm_verification([x, y])
    slot.run([x, y])  # checked: graph run, restore, reference run
    torch.testing.assert_close(y, torch.ones(4))
    slot.run([x, y])  # checked
    slot.run([x, y])  # not checked
    torch.testing.assert_close(y, torch.full((4,), 3.0))
    moved = torch.randn(4)
    (out,) = slot.run([moved, y])  # checked, stale: falls back
    torch.testing.assert_close(out, moved * 2)
    torch.testing.assert_close(y, torch.full((4,), 4.0))
    assert slot.record.variant == Variant.NO_GRAPH


def test_check_numerics_off_disables_the_safety_net() -> None:
    x = torch.randn(4)
    y = torch.zeros(4)
    compiled = Compiled()
    graph = FakeGraph([x, y], mutate=False, stale_after_move=True)
    slot = _slot(compiled, graph, Variant.GRAPH_PI, check_numerics=False)
    slot.arm_verification([x, y])
    slot.run([torch.randn(4), y])
    assert compiled.runs == 0 and slot.record.variant == Variant.GRAPH_PI


class HealthPlan:
    def __init__(self, problem: str | None) -> None:
        self.problem = problem

    def health(self) -> str | None:
        return self.problem


def test_a_failed_vendor_prelude_is_a_mismatch_even_with_equal_outputs() -> None:
    x = torch.randn(4)
    y = torch.zeros(4)
    plan = HealthPlan("vendor prelude status 1")
    graph = FakeGraph([x, y], mutate=False, stale_after_move=False, plan=plan)
    out, problem, reference = check_against_reference(
        lambda: graph.run_with_pi([x, y], False),
        Compiled(),
        [x, y],
        [],
        graph,
        None,  # type: ignore[arg-type]
    )
    assert problem == "vendor prelude status 1"
    torch.testing.assert_close(out, reference)


class FakeSetup:
    def __init__(self, status: int) -> None:
        self.prelude_node = 1
        self.status = torch.tensor([status], dtype=torch.int32)


def _pi_plan(keep: list[Any]) -> PiPlan:
    return PiPlan(object(), [], {}, (), {}, StageLog(), keep_alive=keep)


def test_pi_plan_health_reads_every_prelude_status() -> None:
    assert _pi_plan([object()]).health() is None  # no vendor nodes: nothing to report
    assert _pi_plan([FakeSetup(0), FakeSetup(0)]).health() is None
    problem = _pi_plan([FakeSetup(0), FakeSetup(-1)]).health()
    assert problem is not None and "status -1" in problem


def test_pi_plan_uploads_only_graphs_with_vendor_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    from grace.pi import driver

    uploads: list[tuple[int, int]] = []
    monkeypatch.setattr(driver, "graph_upload", lambda g, s: uploads.append((g, s)))
    _pi_plan([object()]).prepare_launch(None, 7)  # nothing to upload, no handle needed
    assert uploads == []
    _pi_plan([FakeSetup(-1)]).prepare_launch(0x1234, 7)
    assert uploads == [(0x1234, 7)]
    with pytest.raises(RuntimeError, match="no executable graph handle"):
        _pi_plan([FakeSetup(-1)]).prepare_launch(None, 7)


@pytest.mark.parametrize("mutate", [False, True])
def test_outputs_are_copied_only_when_the_reference_run_can_change_them(
    mutate: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import grace.verify

    copies: list[Any] = []
    kept_copy = grace.verify.kept_copy

    def counting(value: Any, min_bytes: int) -> Any:
        copies.append(value)
        return kept_copy(value, min_bytes)

    monkeypatch.setattr(grace.verify, "kept_copy", counting)
    x = torch.randn(4)
    y = torch.zeros(4)
    graph = FakeGraph([x, y], mutate=mutate, stale_after_move=False)
    out, problem, _ = check_against_reference(
        lambda: graph.run_with_copies([x, y], False),
        Compiled(mutate=mutate),
        [x, y],
        [1] if mutate else [],
        graph,
        None,
    )
    assert problem is None
    assert any(value is out for value in copies) == mutate
    torch.testing.assert_close(out[0], x * 2)


@pytest.mark.parametrize("mutate", [False, True])
def test_no_graph_runs_start_and_end_without_a_cublas_workspace(
    mutate: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A callable without side effects runs the no-graph callable first (its output can then go to host
    memory before the replay); a mutating one replays first. Either way the workspaces are dropped right
    before and right after the no-graph run."""
    import grace.verify

    log: list[str] = []
    monkeypatch.setattr(grace.verify.torch_compat, "clear_cublas_workspaces", lambda: log.append("clear"))
    compiled = Compiled(mutate=mutate)

    def no_graph(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        log.append("no_graph")
        return compiled(x, y)

    x, y = torch.randn(4), torch.zeros(4)
    graph = FakeGraph([x, y], mutate=mutate, stale_after_move=False)

    def replay() -> Any:
        log.append("replay")
        return graph.run_with_copies([x, y], False)

    _, problem, _ = check_against_reference(replay, no_graph, [x, y], [1] if mutate else [], graph, None)
    assert problem is None
    no_graph_run = ["clear", "no_graph", "clear"]
    assert log == (["replay", *no_graph_run] if mutate else [*no_graph_run, "replay"])
    torch.testing.assert_close(y, torch.ones(4) if mutate else torch.zeros(4))


def test_a_pure_mismatch_returns_a_fresh_no_graph_output_when_the_reference_went_to_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reference held in host memory is no output for the caller: on a mismatch the no-graph callable
    runs again and its (device) output is returned."""
    import grace.verify

    monkeypatch.setattr(grace.verify, "offload", lambda value, min_bytes: ((value[0].clone().mul_(1),), True))
    x, y = torch.randn(4), torch.zeros(4)
    compiled = Compiled()
    _, problem, reference = check_against_reference(
        lambda: (x * 3,), compiled, [x, y], [], None, None, host_bytes=1
    )
    assert problem is not None
    assert compiled.runs == 2
    torch.testing.assert_close(reference[0], x * 2)
