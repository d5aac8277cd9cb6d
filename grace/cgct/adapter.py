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

On real calls, two or more ``HoistStep`` to one device run as one ``HoistBatch`` (grace.cgct.hoist):
one packed host-to-device copy per call into a fixed device home (Note: [A fixed home for hoisted
inputs]).

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
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grace.cgct.hoist import DeviceMap, HoistBatch, HoistStep, _mapped

log = logging.getLogger(__name__)


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
