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

On real calls, two or more ``HoistStep`` to one device run as one ``HoistBatch``: the CPU tensors'
bytes are packed into one staging buffer (pinned, from a ``grace.staging.StagingRing``), copied to the
device in one asynchronous copy, and the inputs become views of that device buffer, each at a 16-byte
aligned offset (the alignment Inductor's kernels are specialised for). One copy instead of one per
tensor is what keeps a model with several CPU scalars cheap to launch. Tensors the batch cannot pack
as plain bytes (not a dense CPU tensor, autograd history, mixed dtypes, fake tensors during compile)
take the per-step path for that call.

Invariants: steps never modify the caller's tensors; the returned list has one entry per placeholder
of the transformed graph, in order; a batched call yields, per input, the same values, dtype, shape and
strides as the per-step copies.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grace.staging import StagingRing

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

_ALIGN_BYTES = 16


class HoistBatch:
    """Several ``HoistStep`` to one device, applied with one host-to-device copy (see the module doc)."""

    def __init__(self, steps: Sequence[HoistStep]) -> None:
        self.steps = list(steps)
        self.indices = [s.index for s in self.steps]
        self.device = self.steps[0].device
        self._ring: StagingRing | None = None
        self.batched_calls = 0
        self.fallback_calls = 0

    def _packable(self, tensors: list[Any]) -> torch.dtype | None:
        dtype = None
        for t in tensors:
            if type(t) is not torch.Tensor or t.device.type != "cpu" or t.requires_grad:
                return None
            if not t.is_contiguous() or (dtype is not None and t.dtype != dtype):
                return None
            dtype = t.dtype
        return dtype

    def apply(self, inputs: list[Any]) -> None:
        tensors = [inputs[i] for i in self.indices]
        dtype = self._packable(tensors)
        if dtype is None:
            self.fallback_calls += 1
            for step in self.steps:
                step.apply(inputs)
            return
        itemsize = dtype.itemsize
        unit = max(1, _ALIGN_BYTES // itemsize)
        offsets, total = [], 0
        for t in tensors:
            offsets.append(total)
            total += -(-max(t.numel(), 1) // unit) * unit
        if self._ring is None or self._ring.dtype != dtype:
            self._ring = StagingRing(dtype, self.device)
        host = self._ring.acquire(total)
        base = host.data_ptr()
        for t, offset in zip(tensors, offsets, strict=True):
            ctypes.memmove(base + offset * itemsize, t.data_ptr(), t.numel() * itemsize)
        device_buffer = torch.empty(total, dtype=dtype, device=self.device)
        device_buffer.copy_(host[:total], non_blocking=True)
        self._ring.issued()
        for i, t, offset in zip(self.indices, tensors, offsets, strict=True):
            inputs[i] = device_buffer.as_strided(t.shape, t.stride(), offset)
        self.batched_calls += 1


@dataclass
class InputAdapter:
    """Callable applied to the real inputs before each call of the transformed graph."""

    steps: list[Step] = field(default_factory=list)
    _plan: list[Step | HoistBatch] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self._plan = batched_plan(self.steps)

    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        adapted = list(inputs)
        for step in self._plan:
            step.apply(adapted)
        return adapted

    def apply(self, inputs: Sequence[Any], device_map: DeviceMap | None = None) -> list[Any]:
        adapted = list(inputs)
        for step in self.steps:
            step.apply(adapted, device_map)
        return adapted

    def describe(self) -> list[str]:
        return [step.describe() for step in self.steps]


def batched_plan(steps: Sequence[Step]) -> list[Step | HoistBatch]:
    """The steps in order, with the hoists to each device gathered into one ``HoistBatch`` (placed
    where the first of them was) when there are two or more of them."""
    by_device: dict[torch.device, list[HoistStep]] = {}
    for step in steps:
        if isinstance(step, HoistStep):
            by_device.setdefault(step.device, []).append(step)
    plan: list[Step | HoistBatch] = []
    placed: set[torch.device] = set()
    for step in steps:
        if isinstance(step, HoistStep) and len(by_device[step.device]) > 1:
            if step.device not in placed:
                plan.append(HoistBatch(by_device[step.device]))
                placed.add(step.device)
            continue
        plan.append(step)
    return plan
