"""The performance suite's timing references on a CUDA device (suites.raw_graph): the hand capture
replays Inductor's kernels with the values of a direct call, ``raw-graph-copy`` follows new inputs
through its copies, ``raw-graph`` refuses inputs it was not captured on, and a callable that cannot be
captured is a ``ReferenceUnavailable``, never a timing. All tests carry the ``gpu`` marker."""

from __future__ import annotations

import pytest
import torch

from suites.raw_graph import RawGraph, ReferenceUnavailable

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_grace")]

DEVICE = torch.device("cuda", 0)


def _body(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.sin(x @ w) * 2.0 + 1.0


def test_replays_give_the_direct_calls_values_and_copies_follow_new_inputs() -> None:
    x, w = torch.randn(64, 64, device=DEVICE), torch.randn(64, 64, device=DEVICE)
    want = _body(x, w)
    for copy_inputs in (False, True):
        raw = RawGraph(torch.compile(_body), copy_inputs=copy_inputs)
        for _ in range(4):  # compile, warm, capture and replay, replay
            torch.testing.assert_close(raw(x, w), want)
        torch.testing.assert_close(raw.timed_call((x, w))() or raw.outputs, want)
    other = torch.randn(64, 64, device=DEVICE)
    copying = RawGraph(torch.compile(_body), copy_inputs=True)
    for _ in range(3):
        copying(x, w)
    torch.testing.assert_close(copying(other, w), _body(other, w))
    bare = RawGraph(torch.compile(_body), copy_inputs=False)
    for _ in range(3):
        bare(x, w)
    with pytest.raises(ReferenceUnavailable, match="captured on"):
        bare(other, w)
    with pytest.raises(ReferenceUnavailable, match="captured on"):
        bare.timed_call((other, w))


def test_a_callable_with_a_cpu_copy_cannot_be_captured() -> None:
    def reads_the_host(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x * scale.to(x.device)

    raw = RawGraph(torch.compile(reads_the_host), copy_inputs=True)
    x, scale = torch.randn(8, device=DEVICE), torch.full((8,), 2.0)  # pageable host memory
    raw(x, scale)
    raw(x, scale)
    with pytest.raises(ReferenceUnavailable, match="capture by hand failed"):
        raw(x, scale)
