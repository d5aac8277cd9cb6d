"""Note: [Hand back before a capture] (grace.pools) on a CUDA device: a deciding call whose direct PI
capture is declined (an output views an input) and whose no-graph runs leave blocks cached keeps none of
that memory reserved once the next call starts; only the kept graph's pool remains. Every value equals
eager's (float64, rtol = atol = 1e-9). The rule without a device: tests/test_concurrency.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grace import stats
from grace.backend import GraceBackend
from grace.options import GraceOptions

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_grace")]

TOL = {"rtol": 1e-9, "atol": 1e-9}
ROWS = 1 << 20  # 8 MiB per float64 column of the activations: every temporary is a segment of its own
MIB = 1 << 20


def _step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = (x * 2.0).sin()
    h = (h * 3.0 + x).cos() * h
    return x[:1], h.tanh() + h  # the first output views the input: pi_direct is declined after capture


def _cached_by_pool() -> dict[tuple[int, int], tuple[int, int]]:
    """(reserved, reserved but unallocated) bytes per memory pool."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for seg in torch.cuda.memory_snapshot():
        key = tuple(seg.get("segment_pool_id", (0, 0)))
        reserved, free = out.get(key, (0, 0))  # type: ignore[arg-type]
        out[key] = (reserved + seg["total_size"], free + seg["total_size"] - seg["allocated_size"])  # type: ignore[index]
    return out


def test_a_deciding_call_leaves_only_the_kept_graphs_pool_reserved(tmp_path: Path) -> None:
    options = GraceOptions(cache_dir=str(tmp_path), scg=False, host_reference_bytes=1 << 40)
    compiled = torch.compile(_step, backend=GraceBackend(options))
    x = torch.randn(ROWS, 4, device="cuda", dtype=torch.float64)
    expected = [t.cpu() for t in _step(x)]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = _cached_by_pool()
    for _ in range(5):  # warm-up, the deciding call, steady calls (the first one hands back)
        got = [t.cpu() for t in compiled(x)]  # compared on the host: no device temporaries of the test
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, **TOL)
    torch.cuda.synchronize()
    records = [r for r in stats.snapshot() if r["variant"] in ("graph_copies", "graph_pi")]
    assert records and any("pi_direct_declined" in str(r["skip_reasons"]) for r in records), stats.snapshot()
    after = _cached_by_pool()
    new_pools = {k: v for k, v in after.items() if k != (0, 0) and k not in before}
    # the kept graph's pool alone: the declined capture's went back to the device
    assert len(new_pools) == 1, (new_pools, stats.snapshot())
    unused = after.get((0, 0), (0, 0))[1] - before.get((0, 0), (0, 0))[1]
    # the default pool caches nothing new: the reference, check and declined runs' blocks went back
    assert unused < 16 * MIB, (unused / MIB, after)  # half of one 32 MiB activation; 4 MiB measured
