"""No-graph reference outputs held in host memory while a graph's outputs are compared with them.

Problem: checking a graph variant against the no-graph callable needs both outputs at once. A graph
holds its outputs in its pool for as long as it lives, so a no-graph run after the capture puts a second
copy of the outputs on the device: when outputs are as large as the inputs, that copy is what puts
grace's first calls above PyTorch's cudagraph trees in peak memory (Note: [Deciding-call memory],
docs/design/runtime.md).

Design: ``offload`` copies every CUDA tensor of an output tree to host memory (structure and non-tensor
values kept) when the tree holds at least a given number of bytes; ``grace.scg.outputs_match`` brings
such a reference back one chunk at a time. The copy waits for the device, so the device tensors are
freed as soon as the caller drops them.

``kept_copy`` does the same for the snapshots a mutating callable's checks keep (its mutated inputs
before a run, to restore them, and after the reference run, to compare): every tensor is copied, large
trees to host memory; ``kept_inputs`` and ``restore_inputs`` keep the mutated inputs by index and
write them back, for the deciding call (grace.decide) and the verified calls (grace.verify) alike.

Invariants: only CUDA tensors move (lists and tuples are rebuilt, everything else is returned as is); a
tree below the threshold is returned unchanged, object for object.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from grace.capture import dense_view


def map_tensors(fn: Callable[[torch.Tensor], Any], value: Any) -> Any:
    """``value`` with ``fn`` applied to each tensor of it, through lists and tuples (rebuilt); any
    other value is returned as is."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(map_tensors(fn, v) for v in value)
    if isinstance(value, list):
        return [map_tensors(fn, v) for v in value]
    return value


def cuda_bytes(value: Any) -> int:
    """Bytes held by the CUDA tensors of an output tree."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size() if value.is_cuda else 0
    if isinstance(value, (list, tuple)):
        return sum(cuda_bytes(v) for v in value)
    return 0


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu") if tensor.is_cuda else tensor


def kept_copy(value: Any, min_bytes: int) -> Any:
    """A copy of ``value``'s tensors that later writes to them do not change (a snapshot to restore or
    compare with): in host memory when its CUDA tensors hold at least ``min_bytes`` bytes (``min_bytes``
    0: never), else clones on their own devices."""
    to_host = min_bytes > 0 and cuda_bytes(value) >= min_bytes
    return map_tensors(lambda t: _to_host(t) if to_host and t.is_cuda else t.detach().clone(), value)


def kept_inputs(args: Sequence[Any], indices: Sequence[int], min_bytes: int) -> dict[int, torch.Tensor]:
    """``kept_copy`` of the inputs at ``indices``, by index: what ``restore_inputs`` writes back."""
    return dict(zip(indices, kept_copy([args[i] for i in indices], min_bytes), strict=True))


def restore_inputs(args: Sequence[Any], kept: dict[int, torch.Tensor]) -> None:
    """Write the kept values back into the inputs (in place, from host memory or the device)."""
    for i, saved in kept.items():
        dense_view(args[i]).copy_(dense_view(saved))


def offload(value: Any, min_bytes: int) -> tuple[Any, bool]:
    """``(tree, moved)``: ``value`` with its CUDA tensors copied to the host when they hold at least
    ``min_bytes`` bytes (``min_bytes`` 0: never), else ``value`` itself."""
    if min_bytes <= 0 or cuda_bytes(value) < min_bytes:
        return value, False
    return map_tensors(_to_host, value), True
