"""grace.compat.dynamo: the Dynamo/FX facts CGCT relies on, checked on the running torch."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo import exc
from torch._subclasses.fake_tensor import FakeTensorMode

from grace.cgct.adapter import HoistStep, InputAdapter, MirrorStep
from grace.compat import dynamo as compat


@pytest.mark.parametrize(
    ("name", "attribute"),
    [
        ("L['x']", False),
        ("L['xs'][0]", False),
        ("L['kwargs']['mask']", False),
        ("L['self'].anchors", True),
        ("L['self']._modules['head']._buffers['anchors']", True),
        ("L['self'].grids[1]", True),
        ("G['TABLE']", True),
        ("___from_numpy(L['array'])", False),
        (None, False),
    ],
)
def test_attribute_sources(name: str | None, attribute: bool) -> None:
    assert compat.is_attribute_source(name) is attribute


def test_forbidden_ops_include_local_scalar_dense() -> None:
    assert any("_local_scalar_dense" in op for op in compat.forbidden_cudagraph_ops())


def test_plain_restart_analysis_from_a_backend_fails() -> None:
    """Note [Asking Dynamo to retrace]: Dynamo wraps a plain RestartAnalysis from a backend."""

    def backend(gm: torch.fx.GraphModule, inputs: list[object]) -> object:
        raise exc.RestartAnalysis()

    torch._dynamo.reset()
    with pytest.raises(exc.BackendCompilerFailed):
        torch.compile(lambda x: x * 2, backend=backend)(torch.ones(2))


@pytest.mark.skipif(compat.restart_exception_type() is None, reason="no retrace request passes through")
def test_restart_request_makes_dynamo_retrace() -> None:
    calls: list[int] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[object]) -> object:
        calls.append(len(calls))
        if len(calls) == 1:
            restart_type = compat.restart_exception_type()
            assert restart_type is not None and issubclass(restart_type, exc.RestartAnalysis)
            raise restart_type()
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(lambda x: x * 2, backend=backend)(torch.ones(2))
    assert torch.equal(out, torch.full((2,), 2.0)) and calls == [0, 1]


def test_clone_graph_module_keeps_dynamo_metadata() -> None:
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    gm.meta["dynamo_compile_id"] = "0/0"
    placeholder = next(iter(gm.graph.nodes))
    placeholder._dynamo_source = "source"  # type: ignore[attr-defined]
    clone = compat.clone_graph_module(gm)
    assert clone.meta["dynamo_compile_id"] == "0/0"
    assert next(iter(clone.graph.nodes))._dynamo_source == "source"
    assert clone.graph is not gm.graph


def test_mirror_refreshes_only_when_the_attribute_changes() -> None:
    source = torch.arange(4.0)
    mirror = source.clone()
    step = MirrorStep(source=source, mirror=mirror, index=0)
    adapter = InputAdapter([step])
    assert adapter([source])[0] is mirror
    mirror.fill_(-1)  # a stale mirror is left alone while the attribute is unchanged ...
    assert adapter([source])[0][0] == -1
    source.add_(1)  # ... and refreshed in place once the attribute's version moves
    out = adapter([source])[0]
    assert out is mirror and torch.equal(mirror, torch.arange(4.0) + 1)


def test_hoist_step_copies() -> None:
    x = torch.ones(3)
    (copied,) = InputAdapter([HoistStep(index=0, device=torch.device("cpu"))]).apply(
        [x], {torch.device("cpu"): torch.device("cpu")}
    )
    assert copied is not x and torch.equal(copied, x)


def test_several_hoists_share_one_copy_and_keep_values_shapes_and_strides() -> None:
    cpu = torch.device("cpu")
    scales = [torch.tensor(0.5 + i / 16) for i in range(3)]
    table = torch.arange(6.0).reshape(2, 3)
    steps = [HoistStep(index=i, device=cpu) for i in (0, 2, 3, 4)]
    adapter = InputAdapter(steps)
    (batch,) = [s for s in adapter._plan if not isinstance(s, HoistStep)]
    marker = object()
    inputs = [scales[0], marker, scales[1], table, scales[2]]
    for _ in range(3):  # the staging ring is reused across calls
        out = adapter(inputs)
        assert out[1] is marker and inputs[0] is scales[0]  # the caller's list and tensors untouched
        for got, want in zip([out[0], out[2], out[3], out[4]], [*scales[:2], table, scales[2]], strict=True):
            assert got is not want and torch.equal(got, want)
            assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)
            assert got.data_ptr() % 16 == 0
        assert len({t.untyped_storage().data_ptr() for t in (out[0], out[2], out[3], out[4])}) == 1
    assert (batch.batched_calls, batch.fallback_calls) == (3, 0)
    mixed = adapter([scales[0], marker, torch.tensor(3), table, scales[2]])  # int64 among float32
    assert mixed[2].dtype == torch.int64 and torch.equal(mixed[3], table)
    assert batch.fallback_calls == 1


@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
def test_hoists_of_one_shape_are_cut_from_the_copy_in_one_go_with_each_calls_values(shape: tuple) -> None:
    cpu = torch.device("cpu")
    adapter = InputAdapter([HoistStep(index=i, device=cpu) for i in range(4)])
    (batch,) = adapter._plan
    for call in range(5):  # more calls than the staging ring has buffers: each lap reuses its views
        inputs = [torch.full(shape, float(call * 10 + i)) for i in range(4)]
        out = adapter(inputs)
        for got, want in zip(out, inputs, strict=True):
            assert got is not want and torch.equal(got, want)
            assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)
            assert got.data_ptr() % 16 == 0
    assert (batch.batched_calls, batch.fallback_calls) == (5, 0)


def test_one_hoist_stays_a_plain_step() -> None:
    adapter = InputAdapter([HoistStep(index=0, device=torch.device("cpu"))])
    assert [type(s) for s in adapter._plan] == [HoistStep]


def test_a_replacement_example_input_adopts_the_originals_symbolic_context() -> None:
    """AOTAutograd fakes a real example input with the context Dynamo recorded for it; a tensor CGCT
    puts in its place gets the same one (otherwise: fresh symbols with no source, and a guard on one
    cannot be written: Item 6 of the runtime-correctness work)."""
    from torch._guards import TracingContext, tracing

    original, replacement, stranger = torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(3)
    context = TracingContext(FakeTensorMode())
    recorded = object()
    context.tensor_to_context[original] = recorded
    assert not compat.adopt_example_context(replacement, original)  # no tracing context active
    with tracing(context):
        assert compat.adopt_example_context(replacement, original)
        assert context.tensor_to_context[replacement] is recorded
        assert not compat.adopt_example_context(replacement, stranger)  # nothing recorded for it
        assert not compat.adopt_example_context(replacement, 3)
