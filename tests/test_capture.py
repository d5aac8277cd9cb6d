"""grace.capture's pure parts on CPU: placeholders fresh or shared between two captures of the same
inputs (with their layout checked), and zero poisoning of placeholders."""

from __future__ import annotations

import pytest
import torch

from grace.capture import placeholders_for, poison_placeholders


def test_fresh_placeholders_have_the_inputs_layout_at_other_addresses() -> None:
    x = torch.randn(4, 6)[:, ::2]  # strided view
    y = torch.randn(3).expand(5, 3)  # broadcast: stride 0
    held = placeholders_for([x, y, 7], (0, 1))
    assert set(held) == {0, 1}
    for i, t in ((0, x), (1, y)):
        p = held[i]
        assert (p.shape, p.stride(), p.dtype) == (t.shape, t.stride(), t.dtype)
        assert p.data_ptr() != t.data_ptr()


def test_shared_placeholders_are_the_same_tensors() -> None:
    args = [torch.randn(8), torch.randn(2, 3)]
    first = placeholders_for(args, (0, 1))
    second = placeholders_for(args, (0, 1), first)
    assert second is not first  # a graph dropping its dict leaves the other's intact
    assert all(second[i] is first[i] for i in (0, 1))


@pytest.mark.parametrize(
    ("other", "message"),
    [
        (torch.randn(9), r"input 0 is \(8,\)"),  # shape
        (torch.randn(16)[::2], "input 0"),  # stride
        (torch.randn(8, dtype=torch.float64), "float64"),  # dtype
    ],
)
def test_shared_placeholders_must_match_each_input(other: torch.Tensor, message: str) -> None:
    args = [torch.randn(8), torch.randn(2)]
    shared = placeholders_for(args, (0, 1))
    shared[0] = other
    with pytest.raises(ValueError, match=message):
        placeholders_for(args, (0, 1), shared)


def test_shared_placeholders_must_cover_exactly_the_dynamic_inputs() -> None:
    args = [torch.randn(8), torch.randn(2)]
    shared = placeholders_for(args, (0,))
    with pytest.raises(ValueError, match=r"cover inputs \[0\], the capture needs \[0, 1\]"):
        placeholders_for(args, (0, 1), shared)


def test_poison_zeroes_every_placeholder() -> None:
    floats = torch.full((6,), 3.0)
    broadcast = torch.ones(3).expand(4, 3)
    complex_ = torch.ones(2, dtype=torch.complex64)
    ints = torch.arange(1, 6)
    poison_placeholders({0: floats, 1: broadcast, 2: complex_, 3: ints})
    for t in (floats, broadcast, complex_, ints):
        assert not t.any()
