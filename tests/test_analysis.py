"""grace.analysis on CPU: static/dynamic/scalar inputs, CPU tensors, devices, autograd, mutations.

CUDA inputs are fake tensors (FakeTensorMode with device "cuda" works on a CPU-only torch).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from grace.analysis import analyze_inputs, graph_effects, mutated_inputs
from grace.reasons import SkipCode


def _traced(fn: Callable[..., Any], example_values: dict[str, Any] | None = None) -> torch.fx.GraphModule:
    gm = torch.fx.symbolic_trace(fn)
    for node in gm.graph.nodes:
        if example_values and node.name in example_values:
            node.meta["example_value"] = example_values[node.name]
    return gm


def test_static_dynamic_and_scalar_inputs() -> None:
    def f(w: torch.Tensor, x: torch.Tensor, n: int) -> torch.Tensor:
        return x @ w * n

    with FakeTensorMode():
        w = torch.nn.Parameter(torch.empty(4, 4, device="cuda"))
        x = torch.empty(2, 4, device="cuda")
        with torch.no_grad():
            result = analyze_inputs(_traced(f), [w, x, 3])
    assert result.static_indices == (0,)
    assert result.dynamic_indices == (1,)
    assert result.scalar_indices == (2,)
    assert result.device == torch.device("cuda", 0)
    assert result.skip is None


def test_dynamo_marks_parameters_static() -> None:
    seen: dict[str, Any] = {}

    def backend(gm: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        seen["gm"], seen["inputs"] = gm, inputs
        return gm.forward

    model = torch.nn.Linear(4, 4)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(torch.randn(2, 4))
    torch._dynamo.reset()
    result = analyze_inputs(seen["gm"], seen["inputs"])
    assert len(result.static_indices) == 2  # weight and bias
    assert len(result.dynamic_indices) == 1
    assert result.skip is not None and result.skip.code is SkipCode.CPU_INPUT


def test_cpu_op_inside_a_cuda_graph_is_reported() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * torch.tensor(0.5)

    with FakeTensorMode():
        x = torch.empty(4, device="cuda")
        cpu_scalar = torch.empty(())
        out = torch.empty(4, device="cuda")
    gm = _traced(f)
    for node in gm.graph.nodes:
        if node.op == "get_attr":  # the traced torch.tensor(0.5) constant
            node.meta["example_value"] = cpu_scalar
        elif node.op == "call_function":
            node.meta["example_value"] = out
    with torch.no_grad():
        result = analyze_inputs(gm, [x])
    assert result.skip is not None and result.skip.code is SkipCode.CPU_OP
    assert "cpu device" in result.skip.detail


def test_multiple_devices_and_no_cuda() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y.to(x.device)

    with FakeTensorMode():
        a, b = torch.empty(2, device="cuda:0"), torch.empty(2, device="cuda:1")
    with torch.no_grad():
        assert analyze_inputs(_traced(f), [a, b]).skip.code is SkipCode.MULTIPLE_DEVICES  # type: ignore[union-attr]
        cpu = analyze_inputs(_traced(f), [torch.empty(2), torch.empty(2)])
    assert cpu.skip is not None and cpu.skip.code is SkipCode.CPU_INPUT


def test_autograd_graphs_are_declined() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with FakeTensorMode():
        x = torch.empty(2, device="cuda", requires_grad=True)
    with torch.enable_grad():
        result = analyze_inputs(_traced(f), [x])
    assert result.skip is not None and result.skip.code is SkipCode.AUTOGRAD
    with torch.no_grad():
        assert analyze_inputs(_traced(f), [x]).skip is None


def test_unsupported_input_type() -> None:
    def f(x: torch.Tensor, g: Any) -> torch.Tensor:
        return x

    with FakeTensorMode():
        x = torch.empty(2, device="cuda")
    with torch.no_grad():
        result = analyze_inputs(_traced(f), [x, object()])
    assert result.skip is not None and result.skip.code is SkipCode.UNSUPPORTED_INPUT


@pytest.mark.parametrize(
    "fn,expected",
    [
        (lambda x, y: x + y, ()),
        (lambda x, y: x.add_(y), (0,)),
        (lambda x, y: y.view(-1).mul_(2), (1,)),
        (lambda x, y: x[0].zero_(), (0,)),
        (lambda x, y: torch.add(x, 1, out=y), (1,)),
        (lambda x, y: torch.nn.functional.relu(y.transpose(0, 1), inplace=True), (1,)),
        (lambda x, y: (x + 1).add_(y), ()),
    ],
)
def test_mutation_detection_follows_views(fn: Callable[..., Any], expected: tuple[int, ...]) -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> Any:
        return fn(x, y)

    assert mutated_inputs(torch.fx.symbolic_trace(f)) == expected


def test_setitem_and_iadd_are_mutations() -> None:
    graph = torch.fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    graph.call_function(operator.setitem, (x, 0, 1.0))
    graph.call_function(operator.iadd, (y, 1))
    graph.output(y)
    assert mutated_inputs(torch.fx.GraphModule(torch.nn.Module(), graph)) == (0, 1)


def _reduce(x: torch.Tensor) -> torch.Tensor:
    return torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x * 2, "sum", "0"))


def test_collectives_take_the_no_graph_path_only_when_several_ranks_run_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from grace.analysis import collective_skip
    from grace.compat import dynamo as dynamo_compat

    gm = _traced(_reduce)
    skip = collective_skip(gm, world_size=2)
    assert skip is not None and skip.code is SkipCode.COLLECTIVES
    assert "_c10d_functional.all_reduce" in skip.detail and "2 ranks" in skip.detail
    assert collective_skip(gm, world_size=1) is None  # no partner to wait for
    assert collective_skip(_traced(lambda x: x * 2), world_size=8) is None

    # analyze_inputs asks the process group: a graph otherwise fit for CUDA graphs is declined under TP-4.
    monkeypatch.setattr(dynamo_compat, "distributed_world_size", lambda: 4)
    with FakeTensorMode():
        x = torch.empty(2, 4, device="cuda")
        result = analyze_inputs(gm, [x])
    assert result.skip is not None and result.skip.code is SkipCode.COLLECTIVES


def test_world_size_is_one_without_a_process_group() -> None:
    from grace.compat import dynamo as dynamo_compat

    assert dynamo_compat.distributed_world_size() == 1


# --- mutations and random ops from the op schemas (graph_effects) -------------------------------------


@torch.library.custom_op("grace_test::scale", mutates_args=("x",))
def _scale_(x: torch.Tensor, factor: float) -> None:
    x.mul_(factor)


@_scale_.register_fake
def _scale_fake(x: torch.Tensor, factor: float) -> None:
    return None


def _foreach_step(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    torch._foreach_add_([a, b], [c, c])
    return c * 2


def _custom_op(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    torch.ops.grace_test.scale(b, 2.0)
    return a + c


def _out_variant(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    torch.add(a, 1, out=c)
    return a * b


def _through_a_view(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    a.view(-1)[:2].copy_(b[:2])
    return b + c


def _functional(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    t = a + b
    t.add_(c)  # an intermediate, not an input
    return t


def dynamo_graph(fn: Callable[..., Any], *inputs: Any) -> tuple[torch.fx.GraphModule, list[Any]]:
    """The FX graph and example inputs Dynamo hands a backend for ``fn(*inputs)`` (one graph)."""
    seen: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=backend, fullgraph=True)(*inputs)
    finally:
        torch._dynamo.reset()
    assert len(seen) == 1
    return seen[0]


MUTATING = [
    (_foreach_step, {"a", "b"}),
    (_custom_op, {"b"}),
    (_out_variant, {"c"}),
    (_through_a_view, {"a"}),
    (_functional, set()),
]


def written_names(gm: torch.fx.GraphModule, indices: tuple[int, ...]) -> set[str]:
    """The argument names of the inputs at ``indices`` (Dynamo orders inputs by first use)."""
    names = [
        str(n.target).removeprefix("L_").removesuffix("_") for n in gm.graph.nodes if n.op == "placeholder"
    ]
    return {names[i] for i in indices}


@pytest.mark.parametrize(
    "fn,expected", MUTATING, ids=lambda v: getattr(v, "__name__", None) or "-".join(sorted(map(str, v)))
)
def test_writes_come_from_the_op_schemas_under_inference_mode(fn: Callable[..., Any], expected: Any) -> None:
    """Inference tensors have no version counter: the analysis alone must find every write."""
    with torch.inference_mode():
        inputs = [torch.randn(4), torch.randn(4), torch.randn(4)]
        gm, example_inputs = dynamo_graph(fn, *inputs)
        effects = graph_effects(gm, example_inputs)
    assert written_names(gm, effects.mutated) == expected
    assert effects.skip is None


def test_the_fake_run_writes_nothing_real() -> None:
    inputs = [torch.randn(4), torch.randn(4), torch.randn(4)]
    before = [t.clone() for t in inputs]
    with torch.no_grad():
        gm, _ = dynamo_graph(_foreach_step, *[t.clone() for t in inputs])
        graph_effects(gm, inputs)
    assert all(torch.equal(a, b) for a, b in zip(inputs, before, strict=True))


def test_batch_norm_running_statistics_are_writes_only_when_training() -> None:
    norm = torch.nn.BatchNorm1d(4)
    with torch.no_grad():
        gm, example_inputs = dynamo_graph(norm.train(), torch.randn(3, 4))
        training = graph_effects(gm, example_inputs)
        gm, example_inputs = dynamo_graph(norm.eval(), torch.randn(3, 4))
        evaluating = graph_effects(gm, example_inputs)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(training.mutated) == 3  # running mean, running variance, batches tracked
    assert evaluating.mutated == ()
    assert names  # the graph has its buffers as inputs


def test_a_write_to_memory_no_input_owns_is_declined() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    constant = graph.get_attr("constant")
    graph.call_function(torch.ops.aten.add_.Tensor, (constant, x))
    graph.output(x)
    root = torch.nn.Module()
    root.register_buffer("constant", torch.zeros(4))
    effects = graph_effects(torch.fx.GraphModule(root, graph), [torch.ones(4)])
    assert effects.skip is not None and effects.skip.code is SkipCode.MUTATION_UNKNOWN


def test_a_graph_that_cannot_run_on_fake_tensors_counts_every_input_as_written() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y.numpy().sum()  # no data on fake tensors

    effects = graph_effects(torch.fx.symbolic_trace(f), [torch.ones(2), torch.ones(2)])
    assert effects.skip is not None and effects.skip.code is SkipCode.MUTATION_UNKNOWN
    assert effects.mutated == (0, 1)


def _noisy(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return a + torch.rand_like(b)


def _dropout(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(a, 0.5, training=True) + b


def _dropout_off(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(a, 0.5, training=False) + b


@pytest.mark.parametrize(
    "fn,draws",
    [(_noisy, True), (_dropout, True), (_dropout_off, False), (_functional, False), (_custom_op, True)],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_random_ops_come_from_the_dispatched_ops(fn: Callable[..., Any], draws: bool) -> None:
    """Ops tagged nondeterministic_seeded draw; a library's own op may (conservatively, it does)."""
    with torch.no_grad():
        gm, example_inputs = dynamo_graph(fn, torch.randn(4), torch.randn(4), torch.randn(4))
        effects = graph_effects(gm, example_inputs)
    assert bool(effects.random_ops) is draws, effects.random_ops


@pytest.mark.parametrize("dropout_p,draws", [(0.0, False), (0.1, True)])
def test_attention_draws_only_with_a_dropout_probability(dropout_p: float, draws: bool) -> None:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)

    with torch.no_grad():
        gm, example_inputs = dynamo_graph(attend, *(torch.randn(1, 2, 8, 4) for _ in range(3)))
        effects = graph_effects(gm, example_inputs)
    assert bool(effects.random_ops) is draws, effects.random_ops


def test_a_higher_order_op_is_opaque_its_tensors_count_as_written_and_random() -> None:
    def branch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return torch.cond(a.sum() > 0, lambda x: x + 1, lambda x: x - 1, (b,)) + c

    with torch.no_grad():
        gm, example_inputs = dynamo_graph(branch, torch.randn(4), torch.randn(4), torch.randn(4))
        effects = graph_effects(gm, example_inputs)
    assert written_names(gm, effects.mutated) == {"b"}
    assert effects.random_ops and effects.skip is None
