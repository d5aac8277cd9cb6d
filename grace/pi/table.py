"""The device pointer table of parameter indirection and its per-replay update.

Problem: rewritten kernels read each input's address from an 8-byte slot of a device table; before a
replay the slots must hold the addresses of this call's inputs, written without racing the replays
still queued on the stream, and with as few bytes and API calls as possible.

Design: the table is one int64 device tensor; slot ``k`` lives at ``address(k)`` (8-byte aligned, the
alignment the rewritten parameter declarations claim; the tensor itself is 256-byte aligned). A write
packs the slot values into a pinned host buffer of a ``grace.staging.StagingRing`` (reused only once
the copies that read it have completed) and issues one asynchronous host-to-device copy on the current
stream, ordered before the replay that follows. A write with the same values as the previous one
issues nothing: the device already holds them.

Invariant: bytes copied per replay are ``8 * slots`` at most (``bytes_per_copy``), zero when unchanged.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

SLOT_BYTES = 8


class LastValues:
    """What a table was last given, so that a write of the same values can be skipped.

    ``changed(values)`` returns the values as a tuple when a write is due (checking their count), or
    None when they equal the last ones (counted in ``skipped``); ``commit`` records a write."""

    def __init__(self, slots: int, last: tuple[int, ...] | None = None) -> None:
        self.slots = slots
        self.last = last
        self.copies = 0
        self.skipped = 0

    def changed(self, values: Sequence[int]) -> tuple[int, ...] | None:
        current = tuple(values)
        if len(current) != self.slots:
            raise ValueError(f"{len(current)} values for {self.slots} slots")
        if current == self.last:
            self.skipped += 1
            return None
        return current

    def commit(self, current: tuple[int, ...]) -> None:
        self.last = current
        self.copies += 1


class CountsWrites:
    """``copies``, ``skipped`` and ``forget()`` of a table writer whose ``LastValues`` is ``_last``."""

    _last: LastValues

    @property
    def copies(self) -> int:
        return self._last.copies

    @property
    def skipped(self) -> int:
        return self._last.skipped

    def forget(self) -> None:
        """Force the next write to reach the device (after something else may have changed the table)."""
        self._last.last = None


class PointerTable(CountsWrites):
    def __init__(self, slots: int, device: Any) -> None:
        import torch

        from grace.staging import StagingRing

        self.slots = slots
        self.device_table = torch.empty(max(slots, 1), dtype=torch.int64, device=device)
        self._device_slots = self.device_table[:slots]
        self._ring = StagingRing(torch.int64, self.device_table.device)
        self._last = LastValues(slots)
        self._format = struct.Struct(f"<{slots}Q")

    @property
    def bytes_per_copy(self) -> int:
        return SLOT_BYTES * self.slots

    def address(self, slot: int) -> int:
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} of a table with {self.slots}")
        return int(self.device_table.data_ptr()) + SLOT_BYTES * slot

    def write(self, values: Sequence[int]) -> bool:
        """Make the device slots hold ``values`` before the next replay; True when a copy was issued."""
        current = self._last.changed(values)
        if current is None:
            return False
        host = self._ring.acquire(self.slots)
        packed = self._format.pack(*current)
        ctypes.memmove(host.data_ptr(), packed, len(packed))
        self._device_slots.copy_(host[: self.slots], non_blocking=True)
        self._ring.issued()
        self._last.commit(current)
        return True
