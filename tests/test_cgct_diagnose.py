"""grace.cgct.diagnose: every reason Inductor refuses or splits CUDA graphs, with node and source line.

Graphs come from Dynamo (fake ``cuda:0`` tensors, see test_cgct_support) or are written by hand with
FX where Dynamo would graph-break before the case appears.
"""

from __future__ import annotations

import pytest
import torch
import torch._inductor.config as inductor_config
from test_cgct_support import CUDA, Twins, capture
from torch._subclasses.fake_tensor import FakeTensorMode

from grace import cgct
from grace.cgct.diagnose import has_complex_overlap
from grace.cgct.reasons import Diagnosis, Effect, ReasonCode
from grace.compat import dynamo as compat


@pytest.fixture
def twins() -> Twins:
    return Twins(FakeTensorMode(allow_non_fake_inputs=True))


def _codes(diagnoses: list[Diagnosis]) -> set[ReasonCode]:
    return {d.code for d in diagnoses}


def scaled(x: torch.Tensor) -> torch.Tensor:
    return x * torch.tensor(0.5)


@pytest.mark.skipif(not compat.graph_partition_supported(), reason="no graph partitions in this torch")
@pytest.mark.parametrize("partition", [False, True])
def test_cpu_node_effect_follows_graph_partition(twins: Twins, partition: bool) -> None:
    (graph,) = capture(scaled, twins.inputs(torch.randn(4)), twins.mode)
    with inductor_config.patch(graph_partition=partition):
        diagnoses = cgct.diagnose(graph.gm, graph.example_inputs)
    (cpu,) = [d for d in diagnoses if d.code in (ReasonCode.CPU_DEVICE, ReasonCode.PARTITION_SPLIT_CPU_OP)]
    if partition:
        assert cpu.code is ReasonCode.PARTITION_SPLIT_CPU_OP and cpu.effect is Effect.SPLITS_GRAPH
    else:
        assert cpu.code is ReasonCode.CPU_DEVICE and cpu.effect is Effect.DISABLES_GRAPHS
    assert cpu.node.startswith("tensor") and "test_cgct_diagnose.py" in cpu.source
    assert not cpu.transformed


def test_diagnose_leaves_graph_alone(twins: Twins) -> None:
    (graph,) = capture(scaled, twins.inputs(torch.randn(4)), twins.mode)
    code = graph.gm.code
    cgct.diagnose(graph.gm, graph.example_inputs)
    assert graph.gm.code == code


def test_mutated_user_input(twins: Twins) -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2

    (graph,) = capture(model, twins.inputs(torch.randn(4)), twins.mode)
    diagnoses = cgct.diagnose(graph.gm, graph.example_inputs)
    (mutated,) = [d for d in diagnoses if d.code is ReasonCode.MUTATED_INPUTS]
    assert mutated.node == "l_x_" and mutated.effect is Effect.DISABLES_GRAPHS


def test_mutated_buffer_is_not_reported(twins: Twins) -> None:
    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("steps", torch.zeros(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.steps.add_(1)
            return x + self.steps

    (graph,) = capture(twins.module(Counter()), twins.inputs(torch.randn(4)), twins.mode)
    assert ReasonCode.MUTATED_INPUTS not in _codes(cgct.diagnose(graph.gm, graph.example_inputs))


def test_dynamic_shapes(twins: Twins) -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    (graph,) = capture(model, twins.inputs(torch.randn(4, 3)), twins.mode, dynamic=True)
    dynamic = [
        d for d in cgct.diagnose(graph.gm, graph.example_inputs) if d.code is ReasonCode.DYNAMIC_SHAPES
    ]
    assert dynamic
    expected = Effect.RERECORDS if not compat.skip_dynamic_graphs() else dynamic[0].effect
    assert all(d.effect is expected for d in dynamic)


def test_item_is_a_data_dependent_sync(twins: Twins) -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        return x * x.max().item()

    (graph,) = capture(model, twins.inputs(torch.randn(4)), twins.mode, capture_scalar_outputs=True)
    (sync,) = [
        d for d in cgct.diagnose(graph.gm, graph.example_inputs) if d.code is ReasonCode.DATA_DEPENDENT_SYNC
    ]
    assert sync.node.startswith("item") and "_local_scalar_dense" in sync.message
    assert not sync.transformed


def test_control_flow(twins: Twins) -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda v: v + 1, lambda v: v - 1, (x,))

    (graph,) = capture(model, twins.inputs(torch.randn(3)), twins.mode)
    (flow,) = [d for d in cgct.diagnose(graph.gm, graph.example_inputs) if d.code is ReasonCode.CONTROL_FLOW]
    assert flow.effect is Effect.DISABLES_GRAPHS


def test_multiple_devices(twins: Twins) -> None:
    def model(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y.to(x.device)

    with twins.mode:
        inputs = [torch.empty(3, device=CUDA), torch.empty(3, device=torch.device("cuda", 1))]
    (graph,) = capture(model, inputs, twins.mode)
    diagnoses = cgct.diagnose(graph.gm, graph.example_inputs)
    assert ReasonCode.MULTIPLE_DEVICES in _codes(diagnoses)
    result = cgct.transform(graph.gm, graph.example_inputs)
    assert result.gm is graph.gm and result.input_adapter is None


def _fx_graph(fn: object, values: list[object]) -> tuple[torch.fx.GraphModule, list[object]]:
    gm = torch.fx.symbolic_trace(fn)  # type: ignore[arg-type]
    return gm, values


def test_non_tensor_inputs() -> None:
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fn(x: torch.Tensor, scale: float) -> torch.Tensor:
        return x * scale

    with mode:
        x = torch.empty(4, device=CUDA)
    gm, inputs = _fx_graph(fn, [x, 0.5])
    (found,) = [d for d in cgct.diagnose(gm, inputs) if d.code is ReasonCode.NON_TENSOR_INPUTS]
    assert found.node == "scale" and "float" in found.message


def test_incompatible_op() -> None:
    if getattr(torch.Tag, "cudagraph_unsafe", None) is None:
        pytest.skip("this torch has no cudagraph_unsafe tag")
    library = torch.library.Library("grace_cgct_test", "FRAGMENT")
    library.define("unsafe(Tensor x) -> Tensor", tags=(torch.Tag.cudagraph_unsafe,))
    library.impl("unsafe", lambda x: x.clone(), "CompositeExplicitAutograd")
    library.impl("unsafe", lambda x: torch.empty_like(x), "Meta")

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.grace_cgct_test.unsafe(x) + 1

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        x = torch.empty(4, device=CUDA)
    gm, inputs = _fx_graph(fn, [x])
    (found,) = [d for d in cgct.diagnose(gm, inputs) if d.code is ReasonCode.INCOMPATIBLE_OP]
    assert "unsafe" in found.message


def test_cpu_only_graph_has_nothing_to_capture() -> None:
    gm, inputs = _fx_graph(lambda x: x + 1, [torch.ones(3)])
    assert _codes(cgct.diagnose(gm, inputs)) == {ReasonCode.NO_CUDA_WORK}


def test_caching_allocator_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        x = torch.empty(4, device=CUDA)
    gm, inputs = _fx_graph(lambda x: x + 1, [x])
    assert ReasonCode.CACHING_ALLOCATOR_DISABLED in _codes(cgct.diagnose(gm, inputs))


def test_complex_memory_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    base = torch.arange(10.0)
    assert has_complex_overlap(base.as_strided((4, 3), (1, 1)))
    assert not has_complex_overlap(base[:3].expand(4, 3))
    assert not has_complex_overlap(base.reshape(2, 5).t())
    monkeypatch.setattr(compat, "checks_complex_memory_overlap", lambda: True)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        overlapping = torch.empty(10, device=CUDA).as_strided((4, 3), (1, 1))
    gm, inputs = _fx_graph(lambda x: x + 1, [overlapping])
    assert ReasonCode.COMPLEX_MEMORY_OVERLAP in _codes(cgct.diagnose(gm, inputs))
    monkeypatch.setattr(compat, "checks_complex_memory_overlap", lambda: False)
    assert ReasonCode.COMPLEX_MEMORY_OVERLAP not in _codes(cgct.diagnose(gm, inputs))


def test_describe_is_one_line(twins: Twins) -> None:
    (graph,) = capture(scaled, twins.inputs(torch.randn(4)), twins.mode)
    for diagnosis in cgct.transform(graph.gm, graph.example_inputs).diagnoses:
        text = diagnosis.describe()
        assert "\n" not in text and diagnosis.code.value in text
