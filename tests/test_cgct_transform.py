"""CGCT transforms on Dynamo graphs of fake-CUDA models (CPU-only torch is enough).

Each test traces a model with Dynamo (fake ``cuda:0`` tensors, see test_cgct_support), checks the
device of every node before and after ``grace.cgct.transform``, and compares values by running the
original and the transformed graph for real on the CPU with ``cuda:0`` mapped to ``cpu``
(grace.cgct.verify). Transformed graphs must give bit-identical outputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from test_cgct_support import (
    DEVICE_MAP,
    Capture,
    Twins,
    capture,
    devices_of,
    real_inputs,
    strict_fake_run,
)
from torch._subclasses.fake_tensor import FakeTensorMode

from grace import cgct
from grace.cgct import verify
from grace.cgct.adapter import HoistStep, MirrorStep
from grace.cgct.reasons import ReasonCode
from suites.cgct_models import Detector, position_ids

CPU_CODES = {ReasonCode.CPU_DEVICE, ReasonCode.PARTITION_SPLIT_CPU_OP}


@pytest.fixture
def twins() -> Twins:
    return Twins(FakeTensorMode(allow_non_fake_inputs=True))


def _cpu_nodes(gm: torch.fx.GraphModule, inputs: list[Any]) -> set[str]:
    return {name for name, devices in devices_of(gm, inputs).items() if "cpu" in devices}


def _transform_and_check(
    graph: Capture, twins: Twins, **options: Any
) -> tuple[cgct.CGCTResult, set[str], set[str]]:
    before = _cpu_nodes(graph.gm, graph.example_inputs)
    code_before = graph.gm.code
    result = cgct.transform(graph.gm, graph.example_inputs, **options)
    assert graph.gm.code == code_before, "transform must not modify the graph it was given"
    after = _cpu_nodes(result.gm, result.example_inputs)
    problems = verify.compare(
        graph.gm, result, real_inputs(graph.example_inputs, twins), DEVICE_MAP, twins.real_of
    )
    assert problems == []
    strict_fake_run(result.gm, result.example_inputs)  # what AOTAutograd's trace in front of Inductor needs
    return result, before, after


class ScaledLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x) * torch.tensor(0.5)
        y = y + torch.tensor(np.float64(0.25)).to(y.dtype)
        return y * np.float32(1.5) + torch.ones(1).to(x.device)


def test_cpu_scalars_become_gpu_constants(twins: Twins) -> None:
    model = twins.module(ScaledLinear())
    (graph,) = capture(model, twins.inputs(torch.randn(4, 8)), twins.mode)
    result, before, after = _transform_and_check(graph, twins)
    assert before, "the traced graph should create CPU scalars"
    assert after == set()
    assert result.input_adapter is None
    fixed = [d for d in result.diagnoses if d.transformed]
    assert fixed and all(d.code in CPU_CODES for d in fixed)
    assert all(d.source.endswith(".py:" + d.source.rsplit(":", 1)[1]) for d in fixed)
    assert any("test_cgct_transform.py" in d.source for d in fixed)


def test_float_arange_is_folded_with_cpu_values(twins: Twins) -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        return x + torch.arange(0.0, 1.0, 0.1).to(x.device)

    (graph,) = capture(model, twins.inputs(torch.randn(10)), twins.mode)
    result, before, after = _transform_and_check(graph, twins)
    assert before and after == set()
    constants = result.gm._cgct_constants
    assert len(constants) == 1
    assert torch.equal(next(iter(constants.values())), torch.arange(0.0, 1.0, 0.1))


def test_position_ids_static_shapes(twins: Twins) -> None:
    (graph,) = capture(position_ids, twins.inputs(torch.randn(2, 6)), twins.mode)
    _, before, after = _transform_and_check(graph, twins)
    assert before >= {"arange"} and after == set()


def test_position_ids_dynamic_shapes_get_a_device_argument(twins: Twins) -> None:
    (graph,) = capture(position_ids, twins.inputs(torch.randn(2, 6)), twins.mode, dynamic=True)
    result = cgct.transform(graph.gm, graph.example_inputs)
    assert _cpu_nodes(result.gm, result.example_inputs) == set()
    factories = [n for n in result.gm.graph.nodes if n.target is torch.arange]
    assert factories and all(n.kwargs["device"] == torch.device("cuda", 0) for n in factories)
    # Values at a shape other than the traced one: nothing was baked in.
    x = torch.randn(3, 5)
    inputs = [3, 5, x] if len(graph.example_inputs) == 3 else [x]
    assert verify.compare(graph.gm, result, inputs, DEVICE_MAP) == []


def test_cpu_attributes_mirrored(twins: Twins) -> None:
    fake = twins.module(Detector(), cpu_attributes=["anchors", "scale", "grids"])
    (graph,) = capture(fake, twins.inputs(torch.randn(4, 4)), twins.mode)
    result, before, after = _transform_and_check(graph, twins)
    assert len(before) >= 4 and after == set()
    assert result.input_adapter is not None
    steps = result.input_adapter.steps
    assert len(steps) == 4 and all(isinstance(s, MirrorStep) for s in steps)
    assert fake.anchors.device.type == "cpu", "mirroring must leave the user's module alone"
    codes = {d.code for d in result.diagnoses if d.transformed}
    assert codes == {ReasonCode.CPU_ATTRIBUTE}


def test_mutated_copy_of_attribute_stays_a_copy(twins: Twins) -> None:
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.arange(4.0))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            local = self.table.to(x.device)
            local.mul_(2)
            return x + local

    fake = twins.module(Model(), cpu_attributes=["table"])
    (graph,) = capture(fake, twins.inputs(torch.randn(4)), twins.mode)
    result, _, after = _transform_and_check(graph, twins)
    assert after == set()
    assert any(n.target is torch.clone for n in result.gm.graph.nodes)


def test_cpu_input_copy_is_hoisted(twins: Twins) -> None:
    def model(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x * mask.to(x.device).unsqueeze(0)

    inputs = twins.inputs(torch.randn(3, 5), torch.randint(0, 2, (5,)).float(), cpu=[1])
    (graph,) = capture(model, inputs, twins.mode)
    result, before, after = _transform_and_check(graph, twins)
    assert before and after == set()
    assert result.input_adapter is not None
    assert [type(s) for s in result.input_adapter.steps] == [HoistStep]
    assert result.example_inputs[1].device == torch.device("cuda", 0)


def test_item_is_reported_and_left_alone(twins: Twins) -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        return x * x.sum().item() + torch.tensor(1.0)

    graphs = capture(model, twins.inputs(torch.randn(4)), twins.mode, capture_scalar_outputs=True)
    graph = graphs[0]
    diagnoses = cgct.diagnose(graph.gm, graph.example_inputs)
    sync = [d for d in diagnoses if d.code is ReasonCode.DATA_DEPENDENT_SYNC]
    assert sync and not any(d.transformed for d in sync)
    result = cgct.transform(graph.gm, graph.example_inputs)
    assert any(n.op == "call_method" and n.target == "item" for n in result.gm.graph.nodes)
    sync_after = [d for d in result.diagnoses if d.code is ReasonCode.DATA_DEPENDENT_SYNC]
    assert sync_after and not any(d.transformed for d in sync_after)


def test_host_read_of_cpu_input_keeps_it_on_the_cpu(twins: Twins) -> None:
    def model(x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return x * counts.sum().item()

    inputs = twins.inputs(torch.randn(4), torch.arange(3), cpu=[1])
    (graph,) = capture(model, inputs, twins.mode, capture_scalar_outputs=True)
    result = cgct.transform(graph.gm, graph.example_inputs)
    assert result.input_adapter is None
    assert "counts" in " ".join(_cpu_nodes(result.gm, result.example_inputs))
    assert any(d.code in CPU_CODES and not d.transformed for d in result.diagnoses)


def test_returned_cpu_tensor_stays_on_the_cpu(twins: Twins) -> None:
    def model(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, torch.arange(4) * 2

    (graph,) = capture(model, twins.inputs(torch.randn(4)), twins.mode)
    result, before, after = _transform_and_check(graph, twins)
    assert after == before
    blocked = [d for d in result.diagnoses if not d.transformed and d.code in CPU_CODES]
    assert blocked and "returns" in blocked[0].message


def test_random_cpu_values_stay_on_the_cpu(twins: Twins) -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn(4).to(x.device)

    (graph,) = capture(model, twins.inputs(torch.randn(4)), twins.mode)
    result = cgct.transform(graph.gm, graph.example_inputs)
    assert "randn" in _cpu_nodes(result.gm, result.example_inputs)
    assert any("random" in d.message for d in result.diagnoses if not d.transformed)


def test_float_cpu_arithmetic_on_an_input_stays_on_the_cpu(twins: Twins) -> None:
    def model(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return x + (bias * 0.1).exp().to(x.device)

    inputs = twins.inputs(torch.randn(4), torch.randn(4), cpu=[1])
    (graph,) = capture(model, inputs, twins.mode)
    result = cgct.transform(graph.gm, graph.example_inputs)
    assert result.input_adapter is None
    assert any("round differently" in d.message for d in result.diagnoses)


def test_emulation_runs_submodules_with_their_real_parameters(twins: Twins) -> None:
    """Graphs of releases that call built-in modules as submodules (2.4) hold the traced (fake)
    parameters in those submodules; the CPU emulation must run them with the real twins."""

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)
            self.norm = torch.nn.BatchNorm1d(8).eval()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(self.linear(x)) * 2

    real = Model()
    with torch.no_grad():
        real.norm.running_mean.uniform_()
    gm = torch.fx.symbolic_trace(twins.module(real))
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["linear", "norm"]
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = real(x)
    assert torch.equal(verify.emulate(gm, [x], DEVICE_MAP, twins.real_of), expected)
    unchanged = cgct.CGCTResult(gm, [x], None, [])
    assert verify.compare(gm, unchanged, [x], DEVICE_MAP, twins.real_of) == []
