"""A pool's layout and capture footprints on a CUDA device (grace.compat.allocator, grace.poolgroups):
two graphs captured into one pool, and a replay of the first overwrites the second's outputs only where
the first's footprint says it may. Marker ``gpu``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from grace import poolgroups
from grace.compat import allocator

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_grace")]

DEVICE = torch.device("cuda", 0)
N = 1 << 20


def _chain(x: torch.Tensor) -> torch.Tensor:
    t = torch.sin(x) * 3.0  # temporaries the next capture may take
    u = torch.cos(t) + x
    return (u * t).sum(dim=0, keepdim=True) + u[:1]


def _capture(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, pool: object) -> tuple:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(x)  # warm-up outside the pool
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    before = allocator.pool_layout(DEVICE, pool)
    with allocator.AllocationTrace(DEVICE) as trace, torch.cuda.graph(graph, pool=pool):
        out = fn(x)
    after = allocator.pool_layout(DEVICE, pool)
    storage = out.untyped_storage()
    spans = ((storage.data_ptr(), storage.data_ptr() + storage.nbytes()),)
    exact = poolgroups.capture_footprint(before, after, spans, trace.allocated)
    coarse = poolgroups.capture_footprint(before, after, spans)
    if exact is not None and coarse is not None:  # the trace only narrows what the layout allows
        assert poolgroups.merged((*exact, *coarse)) == coarse
    return graph, out, exact, spans


def test_footprints_of_two_captures_into_one_pool_bound_what_a_replay_overwrites() -> None:
    pool = allocator.new_pool()
    x1 = torch.randn(64, N // 64, device=DEVICE)
    x2 = torch.randn(64, N // 64, device=DEVICE)
    g1, out1, footprint1, spans1 = _capture(_chain, x1, pool)
    g2, out2, footprint2, spans2 = _capture(_chain, x2, pool)
    assert footprint1 is not None and footprint2 is not None, "this torch gives no pool layout"
    assert poolgroups.overlap(footprint1, spans1) and poolgroups.overlap(footprint2, spans2)
    assert not poolgroups.overlap(footprint2, spans1), "the first graph's output was in use throughout"
    g2.replay()
    torch.cuda.synchronize()
    expected2 = _chain(x2)
    torch.testing.assert_close(out2, expected2)
    x1.copy_(torch.randn_like(x1))
    g1.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out1, _chain(x1))
    if not poolgroups.overlap(footprint1, spans2):
        torch.testing.assert_close(out2, expected2, msg="a replay wrote outside its footprint")
    del g1, g2


def test_a_capture_records_its_allocations_and_leaves_a_users_recording_alone() -> None:
    if not allocator.has_allocation_history():
        pytest.skip("this torch records no allocator history grace may use")
    x = torch.randn(64, N // 64, device=DEVICE)
    pool = allocator.new_pool()
    _, out, footprint, spans = _capture(_chain, x, pool)
    assert footprint is not None and poolgroups.overlap(footprint, spans)
    assert not torch._C._cuda_isHistoryEnabled(), "grace's recording was left on"
    torch.cuda.memory._record_memory_history("all", context=None)
    try:
        with allocator.AllocationTrace(DEVICE) as trace:
            torch.empty(1 << 20, device=DEVICE)
        assert trace.allocated is None, "a user's recording was read"
        assert torch._C._cuda_isHistoryEnabled(), "a user's recording was turned off"
    finally:
        torch.cuda.memory._record_memory_history(None)
    del out
