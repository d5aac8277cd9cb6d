"""The input adapter: work CGCT moved out of the captured region, done on the real inputs before each
call.

Problem: a CPU input copied to the GPU inside the graph (``x.to(device)``) keeps the graph from being
captured whole, yet the copy must happen on every call with that call's input. A CPU module
attribute that CGCT cannot move for good (see grace.cgct.transforms.attributes) needs a GPU mirror
that follows the attribute when the user changes it.

Design: the adapter is a list of typed steps, applied in order to the input list Dynamo passes to the
compiled graph, outside any CUDA graph:
- ``HoistStep``: replace input ``index`` (a CPU tensor) by its copy on the target device;
- ``MirrorStep``: keep a GPU mirror equal to a CPU attribute; copy again only when the attribute's
  version counter or identity changed (an in-place update or a reassignment), in place, so the
  mirror's address stays fixed and CUDA graphs may treat it as a static input. With ``index`` set it
  also replaces that input by the mirror; without, the mirror is a graph attribute.
``apply`` takes a device map so the steps can be checked on a CPU-only machine (grace.cgct.verify).

Invariants: steps never modify the caller's tensors; the returned list has one entry per placeholder
of the transformed graph, in order.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger(__name__)

DeviceMap = Mapping[torch.device, torch.device]


def _mapped(device: torch.device, device_map: DeviceMap | None) -> torch.device:
    if device_map is None:
        return device
    return device_map.get(device, device)


def _copy_to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    mode = getattr(tensor, "fake_mode", None)  # fake example inputs are copied inside their mode
    if mode is None:
        return tensor.to(device)
    with mode:
        return tensor.to(device)


@dataclass(frozen=True)
class HoistStep:
    index: int
    device: torch.device

    def apply(self, inputs: list[Any], device_map: DeviceMap | None = None) -> None:
        if device_map is None:
            inputs[self.index] = _copy_to(inputs[self.index], self.device)
        else:  # checking without the device: still a copy, as the real one is
            inputs[self.index] = inputs[self.index].to(_mapped(self.device, device_map), copy=True)

    def describe(self) -> str:
        return f"input {self.index} -> {self.device}"


@dataclass
class MirrorStep:
    source: torch.Tensor
    mirror: torch.Tensor
    index: int | None = None
    version: int = field(default=-1)
    source_id: int = field(default=0)

    def __post_init__(self) -> None:
        self.version = self.source._version
        self.source_id = id(self.source)

    def refresh(self, current: torch.Tensor) -> None:
        if id(current) != self.source_id or current._version != self.version:
            with torch.no_grad():
                self.mirror.copy_(current)
            self.source = current
            self.source_id = id(current)
            self.version = current._version
            log.debug("refreshed GPU mirror of a CPU attribute (%s)", tuple(current.shape))

    def apply(self, inputs: list[Any], device_map: DeviceMap | None = None) -> None:
        current = inputs[self.index] if self.index is not None else self.source
        if device_map is not None:
            # Checking on a machine without the target device: the mirror is the attribute itself.
            if self.index is not None:
                inputs[self.index] = current.to(_mapped(self.mirror.device, device_map))
            return
        self.refresh(current)
        if self.index is not None:
            inputs[self.index] = self.mirror

    def describe(self) -> str:
        where = f"input {self.index}" if self.index is not None else "graph attribute"
        return f"GPU mirror of a CPU attribute ({where}, {tuple(self.source.shape)})"


Step = HoistStep | MirrorStep


@dataclass
class InputAdapter:
    """Callable applied to the real inputs before each call of the transformed graph."""

    steps: list[Step] = field(default_factory=list)

    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        return self.apply(inputs)

    def apply(self, inputs: Sequence[Any], device_map: DeviceMap | None = None) -> list[Any]:
        adapted = list(inputs)
        for step in self.steps:
            step.apply(adapted, device_map)
        return adapted

    def describe(self) -> list[str]:
        return [step.describe() for step in self.steps]
