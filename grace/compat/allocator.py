"""What the caching allocator holds in one CUDA graph memory pool, for the pools several graphs share.

Problem: graphs captured into one pool may land on each other's memory; which of them a replay can
overwrite follows from the blocks the pool held before and after each capture (grace.pools). The
allocator's snapshot tells that, but its entry point and fields moved between releases.

Design: ``pool_layout`` reads the snapshot once per call and keeps only the segments of one pool on one
device: the address ranges of its segments and of its allocated blocks. Facts relied on:
- ``torch.cuda.memory_snapshot()`` lists every segment with ``device``, ``address``, ``total_size``,
  ``segment_pool_id`` (the pool's id, as ``graph_pool_handle()`` and ``CUDAGraph.pool()`` give it) and
  ``blocks`` in address order, each with ``size`` and ``state`` (``active_allocated`` for a block in
  use); newer releases give each block its ``address`` too, and take ``include_traces`` to lighten it.
- ``CUDAGraph.capture_end`` stops routing allocations to the pool only after ``cudaStreamEndCapture``
  succeeds: a capture that fails leaves the pool marked as being recorded to, and every later capture
  into it fails (``beginAllocateToPool: already recording``), so ``end_routing`` ends it by hand.
- A private pool's segments go back to the device only once no graph captured into it is left
  (``use_count`` 0), so the ranges a graph's capture used stay the pool's while the graph lives.
The capability (``has_pool_layout``) is probed from the snapshot function's signature and a segment's
fields; without it ``pool_layout`` returns None and callers assume the worst (grace.pools).

The layout cannot tell which free blocks a capture's temporaries took. ``AllocationTrace`` can: around a
capture it turns the allocator's history on (``alloc`` entries with ``addr`` and the requested ``size``,
no stacks), reads the entries and turns it off again. It does so only where the history is off (a
user's recording is neither changed nor read) and this torch can clear the history when it starts;
an entry count at the limit (the ring may have dropped the first ones) or a missing field gives None.

Invariant: nothing here allocates device memory or runs CUDA work; never called during a capture
(``AllocationTrace`` is entered before ``capture_begin`` and left after ``capture_end``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch

Span = tuple[int, int]  # [start, end) in device addresses


@dataclass(frozen=True)
class PoolLayout:
    """The address ranges of one pool's segments and of its blocks in use, each sorted by start."""

    segments: tuple[Span, ...]
    allocated: tuple[Span, ...]


@functools.cache
def _snapshot_keywords() -> frozenset[str]:
    try:
        return frozenset(inspect.signature(torch.cuda.memory_snapshot).parameters)
    except (TypeError, ValueError, AttributeError):
        return frozenset()


def has_pool_layout() -> bool:
    """Whether this torch can tell a pool's segments apart in the allocator's snapshot."""
    return torch.cuda.is_available() and hasattr(torch.cuda, "memory_snapshot")


def _segments() -> list[dict[str, Any]]:
    """Every segment of the snapshot (``layout_of`` keeps one pool's); never narrowed by ``mempool_id``,
    whose handling differs between releases."""
    kwargs: dict[str, Any] = {"include_traces": False} if "include_traces" in _snapshot_keywords() else {}
    return list(torch.cuda.memory_snapshot(**kwargs))


def _blocks(segment: dict[str, Any]) -> Iterable[tuple[int, int, str]]:
    """(address, size, state) of each block of ``segment``, addresses summed where none is given."""
    address = int(segment["address"])
    for block in segment.get("blocks", ()):
        size = int(block["size"])
        start = int(block.get("address", address))
        yield start, size, str(block.get("state", ""))
        address = start + size


def layout_of(segments: Iterable[dict[str, Any]], index: int, pool: Any) -> PoolLayout | None:
    """The layout of ``pool`` on device ``index`` from snapshot ``segments``; None when a segment lacks
    the fields this needs."""
    wanted = tuple(pool)
    spans: list[Span] = []
    allocated: list[Span] = []
    for segment in segments:
        if "segment_pool_id" not in segment or "address" not in segment:
            return None
        if int(segment.get("device", index)) != index:
            continue
        if tuple(segment["segment_pool_id"]) != wanted:
            continue
        start = int(segment["address"])
        spans.append((start, start + int(segment["total_size"])))
        allocated.extend((a, a + n) for a, n, state in _blocks(segment) if state == "active_allocated")
    return PoolLayout(tuple(sorted(spans)), tuple(sorted(allocated)))


def pool_layout(
    device: torch.device, pool: Any, segments: list[dict[str, Any]] | None = None
) -> PoolLayout | None:
    """The layout of ``pool`` (a pool id) on ``device`` now, or None where this torch cannot tell;
    ``segments``: a snapshot's segments taken now (``AllocationTrace.segments``), read instead of
    another snapshot."""
    if pool is None or not has_pool_layout():
        return None
    if segments is None:
        try:
            segments = _segments()
        except Exception:  # an allocator without snapshots (another backend): assume the worst
            return None
    return layout_of(segments, device_index(device), pool)


def device_index(device: torch.device) -> int:
    """The CUDA device a pool lives on: ``device``'s index, or the current device where it names none."""
    return device.index if device.index is not None else torch.cuda.current_device()


def new_pool() -> Any:
    """A fresh pool id for ``capture_begin``, that graphs captured one after another can share."""
    return torch.cuda.graph_pool_handle()


def end_routing(device: torch.device, pool: Any) -> None:
    """After a failed capture into ``pool``: stop routing allocations to it where the failure left them
    routed (nothing happens where they are not)."""
    for name in ("_cuda_endAllocateToPool", "_cuda_endAllocateCurrentStreamToPool"):
        end = getattr(torch._C, name, None)
        if end is None:
            continue
        with contextlib.suppress(Exception):  # not being recorded to: the capture ended it
            end(device_index(device), tuple(pool))
        return


_HISTORY_ENTRIES = 1 << 20  # a capture allocating more than this many blocks gets no trace
_ALIGNMENT = 512  # the caching allocator's smallest block: a block spans its request rounded up to it


@functools.cache
def _history_keywords() -> frozenset[str]:
    try:
        return frozenset(inspect.signature(torch.cuda.memory._record_memory_history).parameters)
    except (TypeError, ValueError, AttributeError):
        return frozenset()


def has_allocation_history() -> bool:
    """Whether grace may record which blocks a capture allocates (Note at the top: ``AllocationTrace``)."""
    needed = {"context", "stacks", "max_entries", "clear_history"}
    return (
        has_pool_layout()
        and hasattr(torch._C, "_cuda_isHistoryEnabled")
        and hasattr(torch.cuda.memory, "_snapshot")
        and needed <= _history_keywords()
    )


def allocations_of(
    entries: Sequence[dict[str, Any]], limit: int = _HISTORY_ENTRIES
) -> tuple[Span, ...] | None:
    """The blocks the ``alloc`` entries of one device's history name, sorted; None where the history
    may be incomplete (``limit`` entries or more) or an entry lacks its address or size."""
    if len(entries) >= limit:
        return None
    spans: list[Span] = []
    for entry in entries:
        if entry.get("action") != "alloc":
            continue
        if "addr" not in entry or "size" not in entry:
            return None
        start, size = int(entry["addr"]), int(entry["size"])
        spans.append((start, start + -(-size // _ALIGNMENT) * _ALIGNMENT))
    return tuple(sorted(spans))


class AllocationTrace:
    """``with AllocationTrace(device) as trace: ...``: afterwards ``trace.allocated`` holds the blocks
    allocated on ``device`` inside the block (from the allocator's history), or None where grace could
    not record them: no such history in this torch, a recording someone else started, an error, or
    ``active`` False (nothing is recorded). ``trace.segments``: the segments of the snapshot the
    history was read from, as the block left them (None where none was taken)."""

    def __init__(self, device: torch.device, *, active: bool = True) -> None:
        self.device = device
        self.active = active
        self.allocated: tuple[Span, ...] | None = None
        self.segments: list[dict[str, Any]] | None = None
        self._owned = False

    def __enter__(self) -> AllocationTrace:
        if not self.active or not has_allocation_history():
            return self
        try:
            if torch._C._cuda_isHistoryEnabled():
                return self
            torch.cuda.memory._record_memory_history(
                "all", context=None, stacks="python", max_entries=_HISTORY_ENTRIES, clear_history=True
            )
            self._owned = True
        except Exception:  # no trace: the caller's footprint stays the layout's
            self._owned = False
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._owned:
            return
        try:
            if kind is None:
                snapshot = torch.cuda.memory._snapshot()
                traces, self.segments = snapshot["device_traces"], list(snapshot["segments"])
                index = device_index(self.device)
                self.allocated = allocations_of(traces[index]) if index < len(traces) else None
        except Exception:  # an unreadable history: no trace
            self.allocated, self.segments = None, None
        finally:
            self._owned = False
            with contextlib.suppress(Exception):
                torch.cuda.memory._record_memory_history(None)


# --- outputs over memory the allocator does not count (Note: [Outputs a shared pool lends]) ---------


@functools.cache
def has_unowned_storage() -> bool:
    """Whether this torch builds a storage over an address without owning it
    (``torch._C._construct_storage_from_data_pointer``, which cudagraph trees use for replay outputs)."""
    return callable(getattr(torch._C, "_construct_storage_from_data_pointer", None))


def unowned_like(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Tensors with the sizes, strides, offsets and dtypes of ``tensors`` over storages that own nothing:
    the memory stays the allocator's, whose block is freed when the last owning tensor dies, whatever
    these hold. Tensors that share a storage get one storage again; none requires grad."""
    construct = torch._C._construct_storage_from_data_pointer
    storages: dict[int, Any] = {}
    out: list[torch.Tensor] = []
    for tensor in tensors:
        own = tensor.untyped_storage()
        key = int(own.data_ptr())
        storage = storages.get(key)
        if storage is None:
            storage = storages[key] = construct(key, tensor.device, int(own.nbytes()))
        fresh = torch.empty((0,), dtype=tensor.dtype, device=tensor.device)
        fresh.set_(storage, tensor.storage_offset(), tensor.size(), tensor.stride())
        out.append(fresh)
    return out
