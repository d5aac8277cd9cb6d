"""The staging ring on a CPU target: ring order, growth, and no events where nothing is pinned."""

from __future__ import annotations

import torch

from grace.staging import StagingRing


def test_buffers_come_round_in_order_and_grow_on_demand() -> None:
    ring = StagingRing(torch.float32, torch.device("cpu"), size=3)
    assert not ring.pinned  # host buffers for a CPU target need no pinning
    first = [ring.acquire(4) for _ in range(3)]
    assert len({b.data_ptr() for b in first}) == 3 and all(b.numel() >= 4 for b in first)
    ring.issued()  # nothing to record without pinned buffers
    assert ring.acquire(4).data_ptr() == first[0].data_ptr()  # the ring comes round
    bigger = ring.acquire(100)
    assert bigger.numel() >= 100 and bigger.dtype == torch.float32
    assert all(ring.acquire(100).numel() >= 100 for _ in range(3))
    ring.synchronize()
