"""The input adapter: work CGCT moved out of the captured region, done on the real inputs before each
call.

Problem: a CPU input copied to the GPU inside the graph (``x.to(device)``) keeps the graph from being
captured whole, yet the copy must happen on every call with that call's input. A CPU module
attribute stays on the CPU (grace never changes the user's objects, see
grace.cgct.transforms.attributes): the graph reads a GPU mirror that must follow the attribute through
every change the user makes, including changes no counter records.

Design: the adapter is a list of typed steps, applied in order to the input list Dynamo passes to the
compiled graph, outside any CUDA graph:
- ``HoistStep``: replace input ``index`` (a CPU tensor) by its copy on the target device;
- ``MirrorStep``: keep a GPU mirror (owned by grace) equal to a CPU attribute that stays where the user
  put it. Before each call the mirror is copied again, in place, when the attribute is another tensor,
  sits at another address, its version counter moved, or (for attributes up to ``RECHECK_BYTES``) its
  bytes differ from the host copy the mirror was made from; a larger one is copied on every call
  (Note: [Writes a version counter does not show]). The mirror's address stays fixed, so CUDA graphs
  may treat it as a static input. With ``index`` set it also replaces that input by the mirror;
  without, the mirror is a graph attribute.
``apply`` takes a device map so the steps can be checked on a CPU-only machine (grace.cgct.verify).

On real calls, two or more ``HoistStep`` to one device run as one ``HoistBatch``: the CPU tensors'
bytes are packed into one staging buffer (pinned, from a ``grace.staging.StagingRing``), copied to the
device in one asynchronous copy, and the inputs become views of that device buffer, each at a 16-byte
aligned offset (the alignment Inductor's kernels are specialised for). One copy instead of one per
tensor is what keeps a model with several CPU scalars cheap to launch. Tensors the batch cannot pack
as plain bytes (not a dense CPU tensor, autograd history, mixed dtypes, fake tensors during compile)
take the per-step path for that call. The device buffer is one fixed home per layout, reused on every
call, so a CUDA graph finds its hoisted inputs at the addresses it was captured with (Note: [A fixed
home for hoisted inputs]).

Invariants: steps never modify the caller's tensors nor hold a strong reference to an input; before
each call every mirror holds its attribute's current bytes; the returned list has one entry per
placeholder of the transformed graph, in order; a batched call yields, per input, the same values,
dtype, shape and strides as the per-step copies; no output handed to the caller lives in memory the
adapter writes again (grace.adapting).
"""

from __future__ import annotations

import ctypes
import enum
import logging
import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class _Seen:
    """What a CPU attribute looked like when its mirror was last made equal to it."""

    ref: weakref.ref[torch.Tensor] | None
    data_ptr: int
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    version: int | None


def _version(tensor: torch.Tensor) -> int | None:
    try:
        return int(tensor._version)
    except RuntimeError:  # inference tensors track no version
        return None


def _seen(tensor: torch.Tensor) -> _Seen:
    return _Seen(
        ref=weakref.ref(tensor),
        data_ptr=tensor.data_ptr(),
        storage_offset=int(tensor.storage_offset()),
        shape=tuple(tensor.shape),
        stride=tuple(tensor.stride()),
        version=_version(tensor),
    )


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s memory as integers of its element size: equal bits, not equal values (-0.0, NaN)."""
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    return tensor.view(_BITS[tensor.element_size()])


def _libc_memcmp() -> Any:
    try:
        function = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError, TypeError):  # no C library to load by name (Windows)
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return function


_MEMCMP = _libc_memcmp()


def _same_bytes(current: torch.Tensor, host: torch.Tensor) -> bool:
    """Whether ``current`` holds the bytes of ``host`` (a contiguous copy of the same shape and dtype).

    A dense tensor is compared with one ``memcmp`` (torch's element-wise ``equal`` costs far more per
    call); others element by element on their bits."""
    if _MEMCMP is not None and current.is_contiguous():
        return int(_MEMCMP(current.data_ptr(), host.data_ptr(), host.nbytes)) == 0
    return torch.equal(_bits(current), _bits(host))


def mirror_unsupported(tensor: torch.Tensor) -> str:
    """'' when ``MirrorStep`` can keep a mirror of ``tensor`` in sync, else why not."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and not _is_fake(tensor):
        return f"a {type(tensor).__name__} (tensor subclass) cannot be compared with its host copy"
    if tensor.layout is not torch.strided or tensor.is_quantized:
        return f"a {tensor.layout} tensor cannot be compared with its host copy"
    element = tensor.element_size() // (2 if tensor.is_complex() else 1)
    if element not in _BITS:
        return f"a {tensor.dtype} tensor cannot be compared with its host copy"
    return ""


def _is_fake(tensor: torch.Tensor) -> bool:
    return getattr(tensor, "fake_mode", None) is not None


class MirrorSync(str, enum.Enum):
    """How a mirror follows its CPU attribute (Note: [Writes a version counter does not show])."""

    RECHECK = "recheck"
    """Copied again when the attribute is another tensor, sits elsewhere, its version moved, or its
    bytes differ from the host copy the mirror was made from (compared on every call)."""
    EVERY_CALL = "every_call"
    """Copied on every call: too large to compare on every call."""


# Note: [Writes a version counter does not show]
# An attribute's version counter moves on every in-place op applied to it or to a view of it, but not
# on a write through ``.data`` (a new tensor with its own counter over the same memory), through a numpy
# array sharing its memory, or through ``ctypes``. A mirror refreshed only on version changes would then
# keep old values and every call would read them: a wrong result. So a small attribute's bytes are
# compared with the host copy the mirror was made from on every call (a memcmp of at most
# ``RECHECK_BYTES``), and a larger one is copied on every call, as the graph did before CGCT.
RECHECK_BYTES = 1 << 20


@dataclass
class MirrorStep:
    """A GPU mirror of a CPU module attribute, kept equal to it before every call (see the module doc).

    ``source`` is the attribute for a graph attribute (``index`` None), which the step reads on every
    call; for a placeholder (``index`` set) the step reads the tensor Dynamo passes and ``source`` is only
    the example it was built from. ``refreshes`` counts the copies made after construction."""

    source: torch.Tensor
    mirror: torch.Tensor
    index: int | None = None
    sync: MirrorSync = field(default=MirrorSync.RECHECK)
    refreshes: int = field(default=0)
    _seen_state: _Seen | None = field(default=None, init=False, repr=False)
    _host: torch.Tensor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.sync is MirrorSync.RECHECK and self.source.nbytes > RECHECK_BYTES:
            self.sync = MirrorSync.EVERY_CALL
        if _is_fake(self.source):
            return  # tracing with fake tensors: nothing to keep in sync
        if self.sync is MirrorSync.RECHECK:
            self._host = self.source.detach().clone(memory_format=torch.contiguous_format)
        self._seen_state = _seen(self.source)
        if self.index is not None:
            self.source = self.mirror  # keep no reference to the user's tensor (only a weak one)

    def _in_sync(self, current: torch.Tensor) -> bool:
        seen = self._seen_state
        if seen is None or self.sync is MirrorSync.EVERY_CALL:
            return False
        if seen.ref is None or seen.ref() is not current or current.data_ptr() != seen.data_ptr:
            return False
        version = _version(current)
        if version is None or version != seen.version:
            return False
        if self.index is None and (  # a graph attribute: no Dynamo guard checked its layout
            current.storage_offset() != seen.storage_offset
            or tuple(current.shape) != seen.shape
            or tuple(current.stride()) != seen.stride
        ):
            return False
        host = self._host
        return host is not None and _same_bytes(current, host)

    def refresh(self, current: torch.Tensor) -> None:
        """Make the mirror equal to ``current`` (the attribute now), copying only when it changed."""
        if self._in_sync(current):
            return
        if tuple(current.shape) != tuple(self.mirror.shape) or current.dtype != self.mirror.dtype:
            raise MirrorMismatch(
                f"the CPU attribute mirrored for the graph is now {current.dtype}{tuple(current.shape)}, "
                f"the graph was compiled for {self.mirror.dtype}{tuple(self.mirror.shape)}"
            )
        with torch.no_grad():
            if self.sync is MirrorSync.RECHECK:
                if self._host is None or self._host.shape != current.shape:
                    self._host = current.detach().clone(memory_format=torch.contiguous_format)
                else:
                    self._host.copy_(current)
                self.mirror.copy_(self._host)
            else:
                self.mirror.copy_(current)
        self._seen_state = _seen(current)
        self.refreshes += 1
        log.debug("refreshed GPU mirror of a CPU attribute (%s)", tuple(current.shape))

    def apply(self, inputs: list[Any], device_map: DeviceMap | None = None) -> None:
        current = inputs[self.index] if self.index is not None else self.source
        if device_map is not None:
            # Checking on a machine without the target device: the mirror is the attribute itself.
            if self.index is not None:
                inputs[self.index] = current.to(_mapped(self.mirror.device, device_map))
            return
        if type(current) is torch.Tensor or not _is_fake(current):
            self.refresh(current)
        if self.index is not None:
            inputs[self.index] = self.mirror

    def describe(self) -> str:
        where = f"input {self.index}" if self.index is not None else "graph attribute"
        how = "copied on every call" if self.sync is MirrorSync.EVERY_CALL else "re-checked on every call"
        return f"GPU mirror of a CPU attribute ({where}, {tuple(self.mirror.shape)}, {how})"


class MirrorMismatch(RuntimeError):
    """A mirrored attribute no longer has the shape or dtype its graph was compiled for."""


Step = HoistStep | MirrorStep

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
        self.home_storage = 0
        self.home_confirmed = False  # a call's outputs were seen and none lived in the home

    def home(self, device: torch.device) -> tuple[torch.Tensor, Sequence[torch.Tensor]]:
        """The device buffer this layout's tensors are copied into on every call, and its views (the
        inputs the graph gets), made on first use (Note: [A fixed home for hoisted inputs])."""
        if self._home is None:
            dtype = self._dtype
            buffer = torch.empty(self.total, dtype=dtype, device=device)
            self._home = (buffer, tuple(self.device_views(buffer)))
            self.home_storage = int(buffer.untyped_storage().data_ptr())
        return self._home

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


@dataclass
class InputAdapter:
    """Callable applied to the real inputs before each call of the transformed graph."""

    steps: list[Step] = field(default_factory=list)
    _plan: list[Step | HoistBatch] = field(default_factory=list, init=False, repr=False)
    _batches: list[HoistBatch] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self._plan = batched_plan(self.steps)
        self._batches = [step for step in self._plan if isinstance(step, HoistBatch)]

    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        adapted = list(inputs)
        for step in self._plan:
            step.apply(adapted)
        return adapted

    def returned(self, outputs: Any) -> None:
        """See grace.adapting: batches that reuse device memory check that no output lives there."""
        for batch in self._batches:
            batch.returned(outputs)

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
