"""Check, on a machine without a GPU, that a CGCT rewrite computes what the original graph computed.

Problem: CGCT must never change values, dtypes or output devices, and the matrix's CPU cells must be
able to check that for every torch release, with no GPU at hand.

Design: devices, shapes and dtypes are checked on fake CUDA tensors (grace.cgct.analysis, and
``transform`` itself refuses a rewrite whose outputs differ). Values are checked here by running the
original and the rewritten graph for real on the CPU, with every target device mapped to the CPU:
device arguments inside the graphs, the input adapter's copies and GPU constants are all redirected.
Folded constants are literal factories and run like any other factory on the mapped device;
mirrors from their CPU sources. Both graphs then run the same CPU kernels, so outputs must be equal
bit for bit. What this cannot see is a difference between CPU and GPU kernels: the plan keeps such
ops on the CPU (grace.cgct.ops), and the GPU suites compare against eager on the device.

Invariant: the graphs are interpreted, never modified.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from grace.cgct.pipeline import CGCTResult
from grace.compat.dynamo import tree_flatten, tree_map

TensorMap = Callable[[torch.Tensor], torch.Tensor]


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


class _Emulator(torch.fx.Interpreter):
    def __init__(
        self, gm: torch.fx.GraphModule, device_map: Mapping[torch.device, torch.device], tensor_map: TensorMap
    ) -> None:
        super().__init__(gm)
        self.device_map = dict(device_map)
        self.tensor_map = tensor_map

    def _device(self, value: Any) -> Any:
        if isinstance(value, torch.device):
            normalized = (
                torch.device(value.type, 0) if value.index is None and value.type == "cuda" else value
            )
            return self.device_map.get(normalized, self.device_map.get(value, value))
        if isinstance(value, str) and value.startswith("cuda"):
            return self._device(torch.device(value))
        return value

    def _map_args(self, args: Any, kwargs: Any) -> tuple[Any, Any]:
        return tree_map(self._device, args), tree_map(self._device, kwargs)

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        args, kwargs = self._map_args(args, kwargs)
        return super().call_function(target, args, kwargs)

    def call_method(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target == "cuda":
            device = args[1] if len(args) > 1 else kwargs.get("device", 0)
            device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
            args, kwargs = (args[0], device), {"non_blocking": kwargs.get("non_blocking", False)}
            target = "to"
        mapped_args, mapped_kwargs = self._map_args(args, kwargs)
        if target == "to" and (mapped_args != args or mapped_kwargs != kwargs):
            # A device copy mapped onto the same device must stay a copy, not become an alias.
            mapped_kwargs = {**mapped_kwargs, "copy": True}
        return super().call_method(target, mapped_args, mapped_kwargs)

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        # Graphs of releases that do not inline built-in modules (2.4) call them as submodules, whose
        # parameters and buffers are the traced (fake) tensors: run with their real, mapped twins.
        args, kwargs = self._map_args(args, kwargs)
        submodule = self.fetch_attr(target)
        named = [*submodule.named_parameters(), *submodule.named_buffers()]
        if not named:
            return submodule(*args, **kwargs)
        tensors = {name: self._real(value) for name, value in named}
        return torch.func.functional_call(submodule, tensors, tuple(args), dict(kwargs))

    def _real(self, value: torch.Tensor) -> torch.Tensor:
        real = self.tensor_map(value)
        return real.to(self._device(real.device))

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        mirrors = getattr(self.module, "_cgct_mirrors", {})
        if target in mirrors:
            return self.tensor_map(mirrors[target])
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor):
            return self._real(value)
        return value


def emulate(
    gm: torch.fx.GraphModule,
    inputs: Sequence[Any],
    device_map: Mapping[torch.device, torch.device],
    tensor_map: TensorMap | None = None,
) -> Any:
    """Run ``gm`` for real with every device in ``device_map`` replaced by its image."""
    with torch.no_grad():
        return _Emulator(gm, device_map, tensor_map or _identity).run(*inputs)


def compare(
    original: torch.fx.GraphModule,
    result: CGCTResult,
    inputs: Sequence[Any],
    device_map: Mapping[torch.device, torch.device],
    tensor_map: TensorMap | None = None,
) -> list[str]:
    """Differences between the original graph and CGCT's result on ``inputs`` ([] when identical)."""
    expected = emulate(original, inputs, device_map, tensor_map)
    adapted = list(inputs)
    if result.input_adapter is not None:
        adapted = result.input_adapter.apply(adapted, device_map)
    actual = emulate(result.gm, adapted, device_map, tensor_map)
    expected_flat, expected_spec = tree_flatten(expected)
    actual_flat, actual_spec = tree_flatten(actual)
    if expected_spec != actual_spec:
        return [f"output structure differs: {expected_spec} vs {actual_spec}"]
    problems: list[str] = []
    for index, (want, got) in enumerate(zip(expected_flat, actual_flat, strict=True)):
        if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor):
            if want.dtype != got.dtype or want.shape != got.shape:
                problems.append(
                    f"output {index}: {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"
                )
            elif not torch.equal(want, got):
                worst = float((want.double() - got.double()).abs().max())
                problems.append(f"output {index}: values differ (max abs {worst})")
        elif want != got:
            problems.append(f"output {index}: {got!r} != {want!r}")
    return problems
