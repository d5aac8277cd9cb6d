"""Training graphs on CPU: the saved-tensor and gradient rule (Note: [Outputs autograd keeps]), what a
training graph's runner is told (grace.training) and the facts read from AOTAutograd on this torch."""

from __future__ import annotations

import copy
import dataclasses
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import fakes
import pytest
import torch

import grace.slot
from grace import poolgroups, stats
from grace.compat import aot as aot_compat
from grace.compat.aot import GraphRole, InnerGraph
from grace.options import TRAINING_OUTPUT_SETS, GraceOptions, GraceOptionsError
from grace.runner import GraceRunner, RunnerPlan
from grace.training import TrainingGraphs, boxed, inner_facts, unboxed

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh_stats() -> Iterator[None]:
    stats.forget_all()
    yield
    stats.forget_all()


def _training_runner(
    monkeypatch: pytest.MonkeyPatch,
    generation: list[int],
    kept_from: int,
    role: GraphRole,
    output_sets: int | None = 1,
    share_pool: bool = False,
) -> tuple[GraceRunner, list[list[torch.Tensor]]]:
    """A runner over real CapturedGraphs whose two outputs are ``x * 2`` (what the caller gets) and
    ``x + 1`` (what a forward saves for its backward); each capture has outputs of its own, listed in
    capture order in the second item (Note: [Output sets] in grace.outputsets)."""
    placeholder = torch.zeros(2, 3)
    sets: list[list[torch.Tensor]] = []

    def capture(facts: Any, args: Sequence[Any]) -> Any:
        own = [torch.zeros(2, 3), torch.zeros(2, 3)]
        sets.append(own)

        class Writes:
            def replay(self) -> None:
                own[0].copy_(placeholder * 2)
                own[1].copy_(placeholder + 1)

            def pool(self) -> tuple[int, int]:
                return (0, len(sets))

        graph = fakes.captured_graph(
            Writes(),
            placeholders={0: placeholder},
            outputs=list(own),
            static_ptrs=[None],
            kept_from=facts.plan.kept_from,
        )
        if facts.pool_group is not None:  # as grace.capture.capture_graph does after the capture
            graph.join_pool_group(facts.pool_group, facts.record, None)
        return graph

    fakes.cpu_warmup(monkeypatch)
    fakes.use_decide(monkeypatch, fakes.decides_graph(capture))
    monkeypatch.setattr(grace.slot.torch_compat, "compiled_call_generation", lambda: generation[0])
    plan = RunnerPlan(
        "h", CPU, static_indices=(), dynamic_indices=(0,), scalar_indices=(), role=role, kept_from=kept_from
    )
    options = GraceOptions(max_output_sets=output_sets, output_sets_share_pool=share_pool)
    runner = GraceRunner(lambda x: [x * 2, x + 1], plan, options, None)
    return runner, sets


def test_a_forward_never_replays_over_tensors_saved_for_a_pending_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Output 1 is saved for the backward (kept from position 1): while something holds it, a call in a
    later compiled call runs without the graph; the caller's output 0 follows the per-call contract."""
    generation = [1]
    runner, sets = _training_runner(monkeypatch, generation, kept_from=1, role=GraphRole.FORWARD)
    xs = [torch.full((2, 3), float(k)) for k in range(5)]
    runner(xs[0])  # warm-up
    generation[0] = 2
    user, saved = runner(xs[1])  # the deciding call's replay
    (own,) = sets
    assert saved is not own[1] and saved.data_ptr() == own[1].data_ptr()  # an alias from the first replay
    assert user is not own[0]
    generation[0] = 3
    _, saved2 = runner(xs[2])  # ``saved`` is held (a pending backward): no replay over it
    torch.testing.assert_close(saved, xs[1] + 1)
    torch.testing.assert_close(saved2, xs[2] + 1)
    assert saved2.data_ptr() != own[1].data_ptr()
    (record,) = stats.snapshot()
    assert record["held_output_calls"] == 1 and record["graph_launches"] == 1
    del saved, saved2  # the backward ran: autograd dropped what it saved
    generation[0] = 4
    user3, saved3 = runner(xs[3])  # ``user`` is still held, but it is the caller's output: replayed
    assert saved3.data_ptr() == own[1].data_ptr()
    torch.testing.assert_close(user3, xs[3] * 2)
    torch.testing.assert_close(saved3, xs[3] + 1)
    (record,) = stats.snapshot()
    assert record["held_output_calls"] == 1 and record["graph_launches"] == 2


def test_a_backward_never_replays_over_gradients_still_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every output of a backward is kept (a parameter's ``.grad`` may be one): accumulation without
    zeroing holds them, and such calls run without the graph; once dropped, the graph replays."""
    generation = [1]
    runner, sets = _training_runner(monkeypatch, generation, kept_from=0, role=GraphRole.BACKWARD)
    xs = [torch.full((2, 3), float(k)) for k in range(4)]
    runner(xs[0])
    grads = runner(xs[1])
    (own,) = sets
    assert all(g is not o for g, o in zip(grads, own, strict=True))
    generation[0] = 2
    again = runner(xs[2])
    torch.testing.assert_close(grads[0], xs[1] * 2)  # the held gradients were not overwritten
    torch.testing.assert_close(again[0], xs[2] * 2)
    assert again[0].data_ptr() != own[0].data_ptr()
    del grads, again
    last = runner(xs[3])
    assert last[0].data_ptr() == own[0].data_ptr()
    torch.testing.assert_close(last[1], xs[3] + 1)
    (record,) = stats.snapshot()
    assert (record["held_output_calls"], record["graph_launches"]) == (1, 2)


def _no_call_ran_without_its_graph() -> None:
    (record,) = stats.snapshot()
    assert record["held_output_calls"] == 0, record


def test_by_default_a_training_graph_takes_output_sets_and_other_graphs_one() -> None:
    """``max_output_sets=None`` resolves by the graph's role; an explicit bound applies to every graph."""
    default = GraceOptions()
    assert default.max_output_sets is None
    assert default.output_sets(training=True) == TRAINING_OUTPUT_SETS > 1
    assert default.output_sets(training=False) == 1
    assert GraceOptions(max_output_sets=3).output_sets(training=True) == 3
    assert GraceOptions(max_output_sets=3).output_sets(training=False) == 3
    for bad in (0, True, 2.0, "4"):
        with pytest.raises(GraceOptionsError, match="max_output_sets"):
            GraceOptions(max_output_sets=bad)  # type: ignore[arg-type]


def test_a_forward_with_default_options_captures_a_set_for_a_second_pending_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two micro-batches before one backward: with the default options the second forward gets a set of
    its own instead of running without the graph, and the first one's saved tensor stays intact."""
    generation = [1]
    runner, sets = _training_runner(monkeypatch, generation, 1, GraphRole.FORWARD, output_sets=None)
    xs = [torch.full((2, 3), float(k)) for k in range(3)]
    runner(xs[0])  # warm-up
    generation[0] = 2
    _, saved_a = runner(xs[1])
    generation[0] = 3
    _, saved_b = runner(xs[2])
    assert len(sets) == 2 and saved_b.data_ptr() == sets[1][1].data_ptr()
    torch.testing.assert_close(saved_a, xs[1] + 1)
    torch.testing.assert_close(saved_b, xs[2] + 1)
    _no_call_ran_without_its_graph()


@pytest.mark.parametrize("share_pool", [False, True])
def test_output_sets_in_one_pool_never_replay_over_a_later_sets_held_outputs(
    monkeypatch: pytest.MonkeyPatch, share_pool: bool
) -> None:
    """Note: [Graphs in one pool]: the second set is captured into the first set's pool; then the
    first set, though nothing holds its own outputs, does not replay while the second set's saved
    tensor is held (its replay could write there): a third set is made. In pools of their own, the
    first set replays. Every saved tensor keeps its value throughout."""
    generation = [1]
    runner, sets = _training_runner(
        monkeypatch, generation, 1, GraphRole.FORWARD, output_sets=4, share_pool=share_pool
    )
    xs = [torch.full((2, 3), float(k)) for k in range(6)]
    runner(xs[0])  # warm-up
    generation[0] = 2
    _, saved_a = runner(xs[1])  # set 1
    generation[0] = 3
    _, saved_b = runner(xs[2])  # set 1 is held: set 2
    assert len(sets) == 2
    first = runner.slots[next(iter(runner.slots))].kept[0].graph
    group = first.pool_group
    assert (group is not None) is share_pool
    if group is not None:
        second = runner.slots[next(iter(runner.slots))].graph
        assert [id(m) for m in group.members] == [id(first), id(second)]
    del saved_a  # set 1 is free, set 2's saved tensor is still held
    generation[0] = 4
    _, saved_c = runner(xs[3])
    torch.testing.assert_close(saved_b, xs[2] + 1)
    torch.testing.assert_close(saved_c, xs[3] + 1)
    if share_pool:
        assert len(sets) == 3 and saved_c.data_ptr() == sets[2][1].data_ptr()
    else:
        assert len(sets) == 2 and saved_c.data_ptr() == sets[0][1].data_ptr()
    del saved_b, saved_c
    generation[0] = 5
    _, saved_d = runner(xs[4])
    torch.testing.assert_close(saved_d, xs[4] + 1)
    _no_call_ran_without_its_graph()
    # why each call that made a set found the others taken (the stats' set_blocks)
    (record,) = [r for r in stats.snapshot() if r["set_blocks"]]
    blocks = record["set_blocks"]
    overwrites = {k: n for k, n in blocks.items() if k.startswith(f"an output of {record['graph_id']}")}
    assert blocks.get("outputs autograd keeps") == (2 if share_pool else 1)
    assert sum(overwrites.values()) == (1 if share_pool else 0), blocks


@pytest.mark.parametrize("share_pool", [False, True])
def test_a_layer_called_twice_per_step_keeps_two_output_sets(
    monkeypatch: pytest.MonkeyPatch, share_pool: bool
) -> None:
    """One compiled layer called for two layers of a model, step after step (Note: [Output sets] in
    grace.outputsets): two sets serve every step. In one pool they are taken earliest first, so the
    second layer never finds the first set blocked by the second and no third set is made."""
    generation = [1]
    runner, sets = _training_runner(
        monkeypatch, generation, 1, GraphRole.FORWARD, output_sets=8, share_pool=share_pool
    )
    runner(torch.zeros(2, 3))  # warm-up
    for step in range(2, 7):
        generation[0] = step
        x1, x2 = torch.full((2, 3), float(step)), torch.full((2, 3), float(-step))
        _, saved1 = runner(x1)  # layer 1: its backward is pending until the step ends
        _, saved2 = runner(x2)  # layer 2
        torch.testing.assert_close(saved1, x1 + 1)
        torch.testing.assert_close(saved2, x2 + 1)
        del saved1, saved2  # the backward ran
    assert len(sets) == 2
    (record,) = stats.snapshot()
    assert record["held_output_calls"] == 0 and record["graph_launches"] == 10


def test_a_pool_groups_released_member_is_spared_until_its_outputs_die() -> None:
    """A set released while a caller still holds its output stays in the group, counted against no
    tensor of its own, until that output dies; then it leaves with its pool."""
    import grace.pools as pools_mod

    first = fakes.captured_graph(
        fakes.CountingReplay(), placeholders={}, outputs=[torch.zeros(3)], kept_from=0
    )
    second = fakes.captured_graph(
        fakes.CountingReplay(), placeholders={}, outputs=[torch.zeros(3)], kept_from=0
    )
    group = poolgroups.PoolGroup((0, 1), first)
    first.pool_group = group
    second.join_pool_group(group, None, None)
    (held,) = second.collect_outputs((), clone=False)  # an alias a caller keeps
    assert first.held_outputs(7) is grace.slot.HeldState.HELD
    second.release()
    assert first.held_outputs(7) is grace.slot.HeldState.HELD and any(m is second for m in group.members)
    del held
    pools_mod.release_unheld()
    assert len(group.members) == 1 and group.members[0] is first
    assert first.held_outputs(7) is grace.slot.HeldState.NONE


def test_a_forward_whose_saved_tensors_are_held_replays_another_output_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Note: [Output sets]: the first forward's saved tensor is held, so the second call captures the
    graph once more with outputs of its own; with both held and the bound (2) reached, a call runs
    without a graph; once the first set is free, it replays again. No held output is ever overwritten."""
    generation = [1]
    runner, sets = _training_runner(monkeypatch, generation, 1, GraphRole.FORWARD, output_sets=2)
    xs = [torch.full((2, 3), float(k)) for k in range(6)]
    runner(xs[0])  # warm-up
    generation[0] = 2
    _, saved_a = runner(xs[1])
    generation[0] = 3
    _, saved_b = runner(xs[2])  # ``saved_a`` is held: a second set
    assert len(sets) == 2
    assert (saved_a.data_ptr(), saved_b.data_ptr()) == (sets[0][1].data_ptr(), sets[1][1].data_ptr())
    generation[0] = 4
    _, saved_c = runner(xs[3])  # both held, two sets already: no graph
    assert len(sets) == 2 and saved_c.data_ptr() not in {own[1].data_ptr() for own in sets}
    for saved, x in ((saved_a, xs[1]), (saved_b, xs[2]), (saved_c, xs[3])):
        torch.testing.assert_close(saved, x + 1)
    del saved_a  # the first backward ran
    generation[0] = 5
    _, saved_d = runner(xs[4])  # the first set is free again
    assert saved_d.data_ptr() == sets[0][1].data_ptr()
    torch.testing.assert_close(saved_d, xs[4] + 1)
    torch.testing.assert_close(saved_b, xs[2] + 1)
    (record,) = stats.snapshot()
    assert (record["graph_launches"], record["held_output_calls"], record["graphs_held"]) == (3, 1, 2)


def test_a_backward_is_no_second_calling_thread() -> None:
    plan = RunnerPlan("h", device=None, static_indices=(), dynamic_indices=(), scalar_indices=())
    forward = GraceRunner(lambda: [], plan, GraceOptions(), None)
    backward = GraceRunner(
        lambda: [], RunnerPlan(**{**plan.__dict__, "role": GraphRole.BACKWARD}), GraceOptions(), None
    )
    assert forward._notes_thread and not backward._notes_thread


def _inner(role: GraphRole, inputs: Sequence[Any], static: tuple[int, ...], caller: int) -> InnerGraph:
    class Code:
        def __init__(self) -> None:
            self.current_callable = lambda args: [a * 2 for a in args if isinstance(a, torch.Tensor)]

    return InnerGraph(role, torch.fx.GraphModule({}, torch.fx.Graph()), tuple(inputs), static, caller, Code())


def test_inner_facts_by_role() -> None:
    inputs = [torch.ones(1), 3, torch.ones(2), torch.ones(3)]
    forward = inner_facts(_inner(GraphRole.FORWARD, inputs, (0,), caller=2))
    assert (forward.static_indices, forward.dynamic_indices, forward.kept_from) == ((0,), (2, 3), 2)
    backward = inner_facts(_inner(GraphRole.BACKWARD, inputs, (0, 2), caller=0))
    assert (backward.static_indices, backward.dynamic_indices, backward.kept_from) == ((), (0, 2, 3), 0)
    inference = inner_facts(_inner(GraphRole.INFERENCE, inputs, (0,), caller=0))
    assert inference.kept_from is None and inference.static_indices == (0,)


def test_the_installed_entry_empties_the_list_and_calls_the_runner() -> None:
    inner = _inner(GraphRole.FORWARD, [torch.ones(2)], (), 1)
    seen: list[Any] = []

    class Runner:
        def __init__(self, compiled: Any) -> None:
            self.compiled = compiled

        def run(self, args: Sequence[Any]) -> Any:
            seen.append(list(args))
            return self.compiled(*args)

    hook = TrainingGraphs(lambda graph, facts, compiled: Runner(compiled))
    hook(inner)
    args = [torch.ones(2)]
    (out,) = inner.output_code.current_callable(args)
    assert args == [] and len(seen) == 1 and hook.installed == [GraphRole.FORWARD]
    torch.testing.assert_close(out, torch.full((2,), 2.0))


def test_a_runner_that_cannot_be_built_leaves_inductors_entry() -> None:
    inner = _inner(GraphRole.BACKWARD, [torch.ones(2)], (), 0)
    entry = inner.output_code.current_callable

    def build(graph: InnerGraph, facts: Any, compiled: Any) -> Any:
        raise RuntimeError("no runner")

    hook = TrainingGraphs(build)
    hook(inner)
    assert inner.output_code.current_callable is entry and hook.installed == []


def test_boxed_and_unboxed_conventions() -> None:
    def graph(args: list[Any]) -> list[Any]:
        out = [a + 1 for a in args]
        args.clear()
        return out

    assert unboxed(graph)(torch.zeros(1), torch.ones(1))[1].item() == 2.0

    class Counts:
        def run(self, args: Sequence[Any]) -> int:
            return len(args)

    inputs = [torch.zeros(1)]
    assert boxed(Counts())(inputs) == 1 and inputs == []


def test_this_torch_tells_the_inner_compile_its_forward_returns() -> None:
    """``num_forward_returns`` read during a real compile: a forward with two outputs for the caller and
    tensors saved for its backward (CPU, through AOTAutograd's own backend)."""
    from torch._dynamo.backends.common import aot_autograd

    seen: dict[str, Any] = {}

    def forward_compiler(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> Any:
        seen["returns"] = aot_compat.forward_returns()
        seen["outputs"] = len(list(gm.graph.nodes)[-1].args[0])
        return gm

    backend = aot_autograd(fw_compiler=forward_compiler, bw_compiler=lambda gm, inputs: gm)

    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.sin(x @ w)
        return y.sum(), y.cos()

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=backend)
    compiled(torch.randn(3, 4), torch.randn(4, 4, requires_grad=True))
    torch._dynamo.reset()
    assert seen["returns"] == 2 and seen["outputs"] > 2  # the rest are saved for the backward


def test_option_training_is_a_bool() -> None:
    assert GraceOptions().training is True
    with pytest.raises(ValueError, match="training must be a bool"):
        GraceOptions(training=1)  # type: ignore[arg-type]


def test_autograd_runs_through_the_installed_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wiring on CPU: the outer graph is declined for autograd only (as on a CUDA device), so the
    forward and backward graphs get runners of their own (no graphs here: their inputs are on CPU);
    AOTAutograd calls them through the installed entries and every step's gradients equal eager's. Once
    Inductor's backward returns, nothing of grace holds the activations autograd saved for it: that run
    took the entry's list (grace.boxing), as it would without grace."""
    from grace import backend, training
    from grace.reasons import SkipCode, SkipReason

    real, real_unboxed = backend._analyse, training.unboxed
    counts: list[tuple[int, int]] = []  # per run of Inductor's code: its tensor inputs, those alive after

    def counting(compiled: Any) -> Any:
        def run_and_count(inputs: list[Any]) -> Any:
            refs = [weakref.ref(t) for t in inputs if isinstance(t, torch.Tensor)]
            out = compiled(inputs)
            counts.append((len(refs), sum(ref() is not None for ref in refs)))
            return out

        return real_unboxed(run_and_count)

    def as_on_a_gpu(gm: Any, example_inputs: Any, options: Any) -> Any:
        facts = real(gm, example_inputs, options)
        needs_grad = any(isinstance(v, torch.Tensor) and v.requires_grad for v in example_inputs)
        if needs_grad and facts.analysis.skip is not None:
            skip = SkipReason(SkipCode.AUTOGRAD, "needs autograd")
            facts = backend._Facts(
                dataclasses.replace(facts.analysis, skip=skip), facts.mutated, facts.random_ops
            )
        return facts

    monkeypatch.setattr(backend, "_analyse", as_on_a_gpu)
    monkeypatch.setattr(training, "unboxed", counting)
    sink = backend.collect_compiled_graphs()
    torch._dynamo.reset()
    try:
        torch.manual_seed(0)
        eager = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
        model = copy.deepcopy(eager)
        compiled = torch.compile(model, backend=backend.GraceBackend(GraceOptions(training=True)))
        for _ in range(3):
            x = torch.randn(4, 8)
            eager(x).pow(2).sum().backward()
            compiled(x).pow(2).sum().backward()
            for p, q in zip(eager.parameters(), model.parameters(), strict=True):
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
                p.grad = q.grad = None
        calls = {r["callable_id"]: r["calls"] for r in stats.snapshot()}
    finally:
        backend.stop_collecting(sink)
        torch._dynamo.reset()
    roles = {info.role: info.callable_id for info in sink}
    assert {"forward", "backward"} <= set(roles)
    assert calls[roles["forward"]] == 3 and calls[roles["backward"]] == 3
    # a forward (its inputs: the parameters and x, all held) and a backward per step, whose saved
    # activations and incoming gradient died with the list (its weights live on in the model)
    assert [alive < total for total, alive in counts] == [False, True] * 3, counts
