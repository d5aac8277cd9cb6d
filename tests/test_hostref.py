"""References held in host memory (grace.hostref) and the chunked comparison that reads them back
(grace.scg.outputs_match). CPU tests check what never moves; the ``gpu`` tests move real CUDA outputs
and find a difference in the last chunk of a reference that lives on the host."""

from __future__ import annotations

import pytest
import torch

from grace.hostref import cuda_bytes, kept_copy, offload
from grace.scg import COMPARE_CHUNK, outputs_match


def test_cpu_trees_and_a_zero_threshold_never_move() -> None:
    tree = (torch.ones(8), [torch.zeros(4), None], 3)
    assert cuda_bytes(tree) == 0
    assert offload(tree, 1) == (tree, False)
    assert offload(tree, 0)[0] is tree


def test_kept_copies_are_independent_and_keep_the_structure() -> None:
    x, y = torch.ones(8), torch.arange(4)
    for threshold in (0, 1):  # CPU tensors are cloned in place whatever the threshold
        kept = kept_copy([x, (y, None)], threshold)
        assert kept[1][1] is None and kept[0] is not x and kept[1][0] is not y
        x.add_(1)
        assert torch.equal(kept[0], torch.ones(8)) and torch.equal(kept[1][0], y)
        x.fill_(1)


def test_chunked_comparison_finds_a_difference_in_the_last_chunk() -> None:
    reference = torch.zeros(COMPARE_CHUNK * 2 + 5)
    candidate = reference.clone()
    assert outputs_match(reference, candidate) is None
    candidate[-1] = 1.0
    problem = outputs_match(reference, candidate)
    assert problem is not None and "max abs difference 1" in problem
    ints = torch.arange(COMPARE_CHUNK + 3)
    changed = ints.clone()
    changed[-1] += 1
    assert outputs_match(ints, ints.clone()) is None
    assert (outputs_match(ints, changed) or "").startswith("output: integer/bool values differ")


@pytest.mark.gpu
def test_cuda_outputs_move_to_the_host_above_the_threshold_and_compare_against_the_device() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    big = torch.randn(COMPARE_CHUNK * 64 + 7, device="cuda")
    tree = (big, [torch.arange(10, device="cuda"), None], "label")
    assert cuda_bytes(tree) == big.nbytes + 10 * 8
    kept, moved = offload(tree, cuda_bytes(tree) + 1)
    assert kept is tree and not moved
    host, moved = offload(tree, cuda_bytes(tree))
    assert moved and host[0].device.type == "cpu" and host[1][0].device.type == "cpu"
    assert host[1][1] is None and host[2] == "label"
    candidate = big.clone()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    assert outputs_match(host[0], candidate) is None
    # chunks, not the tensor: a few chunk-sized temporaries at once (64 chunks in the tensor)
    assert torch.cuda.max_memory_allocated() - before <= 8 * COMPARE_CHUNK * big.element_size()
    candidate[-1] += 1.0
    problem = outputs_match(host[0], candidate)
    assert problem is not None and "max abs difference" in problem
    mask = big > 0  # a mask held in host memory, a replay's on the device with two flips
    flipped = mask.clone()
    flipped[:2] = ~flipped[:2]
    host_mask, moved = offload(mask, 1)
    assert moved and host_mask.device.type == "cpu"
    allowed = {"": 2.0}  # Note: [Flips beside noise]
    assert outputs_match(host_mask, flipped, noise=allowed) is None
    problem = outputs_match(host_mask, flipped, noise={"": 1.0})
    assert problem is not None and f"2 of {mask.numel()}" in problem


@pytest.mark.gpu
def test_kept_copies_of_cuda_tensors_go_to_the_host_from_the_threshold_on() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    state = torch.randn(COMPARE_CHUNK * 3 + 1, device="cuda")
    (small,) = kept_copy([state], state.nbytes + 1)
    (large,) = kept_copy([state], state.nbytes)
    assert small.is_cuda and small.data_ptr() != state.data_ptr()
    assert large.device.type == "cpu"
    assert outputs_match(state, large) is None  # the device tensor as reference, the host copy compared
    state[0] += 1.0
    problem = outputs_match(state, large, "mutated input")
    assert problem is not None and problem.startswith("mutated input")
