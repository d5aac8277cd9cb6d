"""Fake-CUDA twins of CPU models and graph capture through a recording Dynamo backend, for the CGCT
checks of tests/ and suites/ (no tests here).

Problem: CGCT rewrites Dynamo graphs of GPU models, but the matrix's CPU cells (and the project's CPU
tests) have no GPU, and every torch release of the matrix must still be checked.

Design: every model exists twice, a real CPU twin and a fake twin whose "GPU" tensors are fake
``cuda:0`` tensors and whose CPU attributes are fake CPU tensors. Dynamo traces the fake twin through a
backend that records each graph and returns the recorded output values instead of running anything.
The captured graphs, before and after CGCT, are then run for real on the CPU with ``cuda:0`` mapped to
``cpu`` and every fake tensor replaced by its real twin (grace.cgct.verify).

Invariant: this module imports torch; suites/conftest.py never imports it (Triton-only cells collect
the suites without torch), only the test modules that need it do.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo
from torch._subclasses.fake_tensor import FakeTensorMode

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")
DEVICE_MAP = {CUDA: CPU}


@dataclass
class Twins:
    """A fake-CUDA model for tracing and the map from its fake tensors to real CPU tensors."""

    mode: FakeTensorMode
    fake_to_real: dict[int, torch.Tensor] = field(default_factory=dict)

    def fake(self, real: torch.Tensor, device: torch.device) -> torch.Tensor:
        with self.mode:
            fake = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device=device)
        self.fake_to_real[id(fake)] = real
        return fake

    def real_of(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.fake_to_real.get(id(tensor), tensor)

    def inputs(self, *reals: Any, cpu: Iterable[int] = ()) -> list[Any]:
        """Fake versions of real inputs: on cuda:0 unless their position is in ``cpu``."""
        cpu_positions = set(cpu)
        return [
            self.fake(v, CPU if i in cpu_positions else CUDA) if isinstance(v, torch.Tensor) else v
            for i, v in enumerate(reals)
        ]

    def module(self, real: torch.nn.Module, cpu_attributes: Iterable[str] = ()) -> torch.nn.Module:
        """A deep copy of ``real`` whose tensors are fakes: on cuda:0, or on the CPU when their dotted
        name (``anchors``, ``head.table``, ``grids`` for a list) is listed in ``cpu_attributes``."""
        on_cpu = set(cpu_attributes)
        fake = copy.deepcopy(real)
        for prefix, (real_sub, fake_sub) in _paired_modules(real, fake):
            for name, param in list(real_sub._parameters.items()):
                if param is None:
                    continue
                device = CPU if f"{prefix}{name}" in on_cpu else CUDA
                fake_sub._parameters[name] = torch.nn.Parameter(
                    self.fake(param.data, device), requires_grad=param.requires_grad
                )
                self.fake_to_real[id(fake_sub._parameters[name])] = param
            for name, buffer in list(real_sub._buffers.items()):
                if buffer is not None:
                    device = CPU if f"{prefix}{name}" in on_cpu else CUDA
                    fake_sub._buffers[name] = self.fake(buffer, device)
            for name, value in list(vars(real_sub).items()):
                device = CPU if f"{prefix}{name}" in on_cpu else CUDA
                if isinstance(value, torch.Tensor):
                    setattr(fake_sub, name, self.fake(value, device))
                elif isinstance(value, list) and value and all(isinstance(v, torch.Tensor) for v in value):
                    setattr(fake_sub, name, [self.fake(v, device) for v in value])
        return fake


def _paired_modules(real: torch.nn.Module, fake: torch.nn.Module) -> list[tuple[str, tuple[Any, Any]]]:
    fake_modules = dict(fake.named_modules())
    return [
        (f"{name}." if name else "", (module, fake_modules[name])) for name, module in real.named_modules()
    ]


@dataclass
class Capture:
    gm: torch.fx.GraphModule
    example_inputs: list[Any]
    result: Any = None


def capture(
    fn: Callable[..., Any],
    inputs: list[Any],
    mode: FakeTensorMode,
    on_graph: Callable[[torch.fx.GraphModule, list[Any]], Any] | None = None,
    dynamic: bool | None = False,
    **dynamo_config: Any,
) -> list[Capture]:
    """Compile ``fn`` with a backend that records each graph (and runs ``on_graph`` on it), call it
    once on ``inputs`` under ``mode``. The backend returns the recorded output values instead of
    running anything."""
    captures: list[Capture] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        record = Capture(gm, list(example_inputs))
        captures.append(record)
        if on_graph is not None:
            record.result = on_graph(gm, list(example_inputs))
        output = next(n for n in gm.graph.nodes if n.op == "output")
        values = torch.fx.node.map_arg(output.args[0], lambda n: n.meta.get("example_value"))
        return lambda *args: values

    torch._dynamo.reset()
    with torch._dynamo.config.patch(**dynamo_config), mode, torch.no_grad():
        torch.compile(fn, backend=backend, dynamic=dynamic)(*inputs)
    return captures


def real_inputs(example_inputs: list[Any], twins: Twins, seed: int = 0) -> list[Any]:
    """Real CPU inputs for a captured graph: real twins of attributes, random values for the rest."""
    generator = torch.Generator().manual_seed(seed)
    values: list[Any] = []
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            real = twins.fake_to_real.get(id(value))
            if real is None:
                shape = [int(s) for s in value.shape]
                if value.dtype.is_floating_point:
                    real = torch.randn(shape, generator=generator, dtype=value.dtype)
                elif value.dtype == torch.bool:
                    real = torch.randint(0, 2, shape, generator=generator).bool()
                else:
                    real = torch.randint(0, 100, shape, generator=generator, dtype=value.dtype)
            values.append(real.detach())
        elif isinstance(value, torch.SymInt):
            values.append(int(value.node.hint))
        else:
            values.append(value)
    return values


def devices_of(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> dict[str, set[str]]:
    """Devices of every node's tensor outputs, from a fake run (grace.cgct.analysis)."""
    from grace.cgct.analysis import analyze

    facts = analyze(gm, example_inputs)
    return {node.name: {str(d) for d in record.devices} for node, record in facts.nodes.items()}


def strict_fake_run(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> None:
    """Run ``gm`` once under a ``FakeTensorMode`` that refuses real tensors, as AOTAutograd's trace in
    front of Inductor does: inputs, parameters and buffers become fakes of the same shape, strides, dtype
    and device; anything else the graph reaches (a tensor attribute a transform left behind) stays real
    and raises here as it would in Inductor."""
    from torch.func import functional_call
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=ShapeEnv())  # .item() gives a symbol

    def fake(value: Any) -> Any:
        if isinstance(value, torch.SymInt):
            return int(value.node.hint)
        if not isinstance(value, torch.Tensor):
            return value
        with mode:
            return torch.empty_strided(
                tuple(int(s) for s in value.shape),
                tuple(int(s) for s in value.stride()),
                dtype=value.dtype,
                device=value.device,
            )

    state = {name: fake(t) for name, t in [*gm.named_parameters(), *gm.named_buffers()]}
    inputs = tuple(fake(v) for v in example_inputs)
    with mode, torch.no_grad():
        functional_call(gm, state, inputs)
