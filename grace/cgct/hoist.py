"""CPU inputs hoisted out of the captured region: copied to their device before each call.

Problem: CGCT replaces a graph's ``x.to(device)`` of a CPU input by an input that is already on the
device (grace.cgct.transforms); the copy must still happen, on every call, with that call's values, and
cheaply: a model with several CPU scalars would otherwise pay one synchronous copy per scalar.

Design: ``HoistStep`` copies one input. Two or more to one device run as one ``HoistBatch``: the CPU
tensors' bytes are packed into one pinned staging buffer (a ``grace.staging.StagingRing``), copied to
the device in one asynchronous copy, and the inputs become views of the device buffer, each at a
16-byte aligned offset (the alignment Inductor's kernels are specialised for). Tensors the batch cannot
pack as plain bytes (not a dense CPU tensor, autograd history, mixed dtypes, fake tensors during
compile) take the per-step path for that call. The device buffer is one fixed home per layout, reused
on every call (Note: [A fixed home for hoisted inputs]).

Invariants: the caller's tensors are never modified; a batched call yields, per input, the same values,
dtype, shape and strides as the per-step copies; no output handed to the caller lives in a home that a
later call rewrites (grace.adapting).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grace.compat import torch as torch_compat
from grace.hostref import map_tensors
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


_ALIGN_BYTES = 16
_LAYOUTS_KEPT = 16  # call patterns of one batch whose packing is kept (dynamic shapes: a few)


# Note: [A fixed home for hoisted inputs]
# A batch copies its CPU tensors into one device buffer per layout that it keeps (the layout's home),
# not into a fresh allocation per call: the graph reads its hoisted inputs at the addresses it was
# captured with, so a replay needs no pointer update, and the inputs handed to the runner are the same
# views on every call. Three things make reusing the home safe:
# - order on the GPU: the copy into the home is queued on the current stream; when that stream is not
#   the one the previous call used, it first waits for that stream, so no run still queued there reads
#   the home while it is rewritten. Within one stream, queue order does it.
# - order on the host: one call's copy and compiled run are not interleaved with another call's
#   (grace.adapting), so a call's graph reads that call's values.
# - outputs: a graph may return a hoisted input or a view of it (``return cpu_ids.to("cuda")``). Eager
#   returns a fresh tensor each call; the home would be overwritten by the next one. ``returned`` looks
#   at the first call's outputs of each layout, and an output inside a home ends the reuse for the whole
#   batch: later calls copy into fresh buffers (the output already returned is never written again).


class HoistBatch:
    """Several ``HoistStep`` to one device, applied with one host-to-device copy (see the module doc)."""

    def __init__(self, steps: Sequence[HoistStep]) -> None:
        self.steps = list(steps)
        self.indices = [s.index for s in self.steps]
        self.device = self.steps[0].device
        self._ring: StagingRing | None = None
        self._layouts: dict[tuple[Any, ...], _PackedLayout] = {}
        self.batched_calls = 0
        self.fallback_calls = 0
        self.reuse_homes = True  # Note: [A fixed home for hoisted inputs]; False once an output was in one
        self._unconfirmed: list[_PackedLayout] = []  # layouts whose home has not yet been seen in outputs
        self._last_stream: Any = None

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
        layout = self._layout_of(tensors, dtype)
        if self._ring is None or self._ring.dtype != dtype:
            self._ring = StagingRing(dtype, self.device)
        host = self._ring.acquire(layout.total)
        torch_compat.foreach_copy(layout.host_views(host), tensors)  # one call packs every tensor
        if self.reuse_homes:
            target, views = layout.home(self.device)
            self._wait_for_last_stream()
            if not layout.home_confirmed:
                self._unconfirmed.append(layout)
        else:
            target = torch.empty(layout.total, dtype=dtype, device=self.device)
            views = layout.device_views(target)
        target.copy_(host[: layout.total], non_blocking=True)
        self._ring.issued()
        for i, view in zip(self.indices, views, strict=True):
            inputs[i] = view
        self.batched_calls += 1

    def returned(self, outputs: Any) -> None:
        """Stop reusing homes when an output lives in one (Note: [A fixed home for hoisted inputs])."""
        if not self._unconfirmed:
            return
        homes = {layout.home_storage for layout in self._unconfirmed}
        storages: list[int] = []
        map_tensors(lambda t: storages.append(int(t.untyped_storage().data_ptr())), outputs)
        if homes.intersection(storages):
            self.reuse_homes = False
            log.debug("grace: a graph returned a hoisted input; its hoists now copy into fresh buffers")
        else:
            for layout in self._unconfirmed:
                layout.home_confirmed = True
        self._unconfirmed.clear()

    def _wait_for_last_stream(self) -> None:
        if self.device.type != "cuda" or self._ring is None:
            return
        stream = self._ring.current_stream()
        last = self._last_stream
        if last is not None and last is not stream:
            stream.wait_stream(last)
        self._last_stream = stream

    def _layout_of(self, tensors: list[torch.Tensor], dtype: torch.dtype) -> _PackedLayout:
        key = (dtype, *((tuple(t.shape), t.stride()) for t in tensors))
        layout = self._layouts.get(key)
        if layout is None:
            if len(self._layouts) >= _LAYOUTS_KEPT:
                self._layouts.clear()
                self._unconfirmed.clear()
            layout = self._layouts[key] = _PackedLayout.of(tensors, dtype)
        return layout


class _PackedLayout:
    """Where each tensor of one call pattern (shapes, strides, dtype) sits in the packed buffer: element
    offsets aligned to ``_ALIGN_BYTES`` (kernels may assume aligned inputs), the views of each staging
    buffer that receive the tensors (made once per buffer), and how the device buffer is cut into the
    inputs: one ``unbind`` when every tensor has the same contiguous shape, else one view each."""

    def __init__(self, shapes: list[tuple[tuple[int, ...], tuple[int, ...]]], dtype: torch.dtype) -> None:
        unit = max(1, _ALIGN_BYTES // dtype.itemsize)
        self._dtype = dtype
        self.shapes = shapes
        self.offsets: list[int] = []
        total = 0
        for shape, _ in shapes:
            self.offsets.append(total)
            total += -(-max(math.prod(shape), 1) // unit) * unit
        self.total = total
        first = shapes[0][0]
        uniform = all(shape == first for shape, _ in shapes) and all(
            stride == _contiguous_strides(shape) for shape, stride in shapes
        )
        self.rows = self.offsets[1] - self.offsets[0] if uniform and len(shapes) > 1 else 0
        self._host: dict[int, list[torch.Tensor]] = {}
        self._home: tuple[torch.Tensor, Sequence[torch.Tensor]] | None = None
        self.home_confirmed = False  # a call's outputs were seen and none lived in the home

    def home(self, device: torch.device) -> tuple[torch.Tensor, Sequence[torch.Tensor]]:
        """The device buffer this layout's tensors are copied into on every call, and its views (the
        inputs the graph gets), made on first use (Note: [A fixed home for hoisted inputs])."""
        if self._home is None:
            buffer = torch.empty(self.total, dtype=self._dtype, device=device)
            self._home = (buffer, tuple(self.device_views(buffer)))
        return self._home

    @property
    def home_storage(self) -> int | None:
        """The address of the home's storage (None before it is made)."""
        return None if self._home is None else int(self._home[0].untyped_storage().data_ptr())

    @classmethod
    def of(cls, tensors: list[torch.Tensor], dtype: torch.dtype) -> _PackedLayout:
        return cls([(tuple(t.shape), t.stride()) for t in tensors], dtype)

    def host_views(self, host: torch.Tensor) -> list[torch.Tensor]:
        views = self._host.get(host.data_ptr())
        if views is None:  # a staging buffer of the ring: the same buffer on every lap
            views = self._host[host.data_ptr()] = self._views(host)
        return views

    def device_views(self, buffer: torch.Tensor) -> Sequence[torch.Tensor]:
        if self.rows:
            shape = self.shapes[0][0]
            numel = math.prod(shape)
            return (
                buffer.view(len(self.shapes), self.rows)[:, :numel].view(len(self.shapes), *shape).unbind(0)
            )
        return self._views(buffer)

    def _views(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        return [
            buffer.as_strided(shape, stride, offset)
            for (shape, stride), offset in zip(self.shapes, self.offsets, strict=True)
        ]


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
