"""A ring of host staging buffers for asynchronous host-to-device copies.

Problem: a copy from pageable host memory to the GPU makes the CPU wait; a copy from pinned memory
does not, but the pinned buffer must not be rewritten while a copy queued on the stream may still
read it. Several per-call copies (the PI pointer table, CPU inputs CGCT hoists) need exactly this.

Design: ``StagingRing`` holds ``size`` host buffers (pinned when the copies go to a CUDA device) and one
CUDA event per buffer. ``acquire`` hands out the next buffer, first waiting for the event recorded after
the last copy that read it; ``issued`` records that event on the current stream of the copies' device
once the caller has queued its copy (not the current device's, which may be another GPU). Buffers and
events are made on the first ``acquire``, never at construction (a ring may be built during a CUDA graph
capture, where pinned allocation and event creation are not allowed), and grow when a larger buffer is
asked for.

Invariant: a buffer returned by ``acquire`` is not read by any copy still queued on the GPU.
"""

from __future__ import annotations

from typing import Any

import torch

from grace.compat import torch as torch_compat

RING = 8
_STREAMS_KEPT = 8


class StagingRing:
    def __init__(self, dtype: torch.dtype, device: torch.device, size: int = RING) -> None:
        self.dtype = dtype
        self.device = device  # the copies' device: its current stream is the one they are queued on
        self.pinned = device.type == "cuda"
        self.size = size
        self._buffers: list[torch.Tensor] = []
        self._events: list[Any] = []
        self._recorded = [False] * size
        self._next = 0
        self._current = -1
        self._streams: dict[int, Any] = {}

    def _make(self, numel: int) -> None:
        self.synchronize()
        self._buffers = [
            torch.empty(max(numel, 1), dtype=self.dtype, pin_memory=self.pinned) for _ in range(self.size)
        ]
        if self.pinned and not self._events:
            self._events = [torch.cuda.Event() for _ in range(self.size)]
        self._recorded = [False] * self.size

    def acquire(self, numel: int) -> torch.Tensor:
        """A host buffer of at least ``numel`` elements that no queued copy reads any more."""
        if not self._buffers or self._buffers[0].numel() < numel:
            self._make(numel)
        k = self._next
        self._next = (k + 1) % self.size
        if self._recorded[k]:
            self._events[k].synchronize()
            self._recorded[k] = False
        self._current = k
        return self._buffers[k]

    def issued(self) -> None:
        """The copy reading the last acquired buffer is queued on the device's current stream."""
        k = self._current
        if self.pinned and k >= 0:
            self._events[k].record(self.current_stream())
            self._recorded[k] = True

    def current_stream(self) -> Any:
        """The device's current stream, its ``torch.cuda.Stream`` kept per handle (building one per
        call costs more than the copy it orders): the same object for a stream while it is kept."""
        handle = torch_compat.current_raw_stream(self.device)
        stream = self._streams.get(handle)
        if stream is None:
            if len(self._streams) >= _STREAMS_KEPT:
                self._streams.clear()
            stream = self._streams[handle] = torch.cuda.current_stream(self.device)
        return stream

    def synchronize(self) -> None:
        """Wait until no queued copy reads any buffer of the ring."""
        for k, recorded in enumerate(self._recorded):
            if recorded:
                self._events[k].synchronize()
                self._recorded[k] = False
