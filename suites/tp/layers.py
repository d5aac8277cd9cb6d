"""Megatron-style tensor-parallel linear layers and the shard math behind them.

Problem: a TP model must compute what the unsharded model computes (up to the order of a reduction)
while each rank holds only 1/world of the large weights, with exactly one all-reduce per
column-then-row pair of layers (Megatron-LM's MLP and attention split).

Design: ``nn.Linear`` stores its weight as (out_features, in_features).
- ``ColumnParallelLinear`` holds this rank's contiguous block of *output* features: rows
  ``shard_range(out_features)`` of the weight and the same block of the bias. Its output is this rank's
  slice of the full output's last dimension; no communication.
- ``RowParallelLinear`` holds this rank's block of *input* features: columns ``shard_range(in_features)``
  of the weight. Its input is this rank's slice (what a column-parallel layer produced), its product a
  partial sum that an all-reduce over the TP group completes (``suites.tp.collectives.all_reduce_sum``);
  the bias, replicated, is added once after the reduction.
Layers are cut from a full ``nn.Linear`` (``from_full``), never initialised on their own, so the TP model
and the unsharded reference share every weight. Attention heads split the same way: heads are contiguous
blocks of rows of the q/k/v weights, so a column shard of whole heads is a head shard.

Invariants (tested in tests/test_tp.py at world sizes 1, 2 and 4 in one process): the concatenation of
the column-parallel outputs of all ranks is the full layer's output; the sum of the row-parallel partial
outputs of all ranks plus the bias is the full layer's output; a dimension that the world size does not
divide is refused with ``ShardingError`` (no uneven shards).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from suites.tp.collectives import TPGroup, all_reduce_sum


class ShardingError(ValueError):
    """A dimension cannot be split evenly over the TP world size."""


def shard_range(size: int, rank: int, world_size: int, what: str = "dimension") -> slice:
    """The contiguous block of ``size`` that ``rank`` of ``world_size`` holds."""
    if size % world_size:
        raise ShardingError(
            f"{what} of size {size} does not split over {world_size} ranks; choose a size divisible "
            f"by the TP world size (or run with --nproc-per-node dividing {size})"
        )
    block = size // world_size
    return slice(rank * block, (rank + 1) * block)


def shard_dim(tensor: torch.Tensor, dim: int, tp: TPGroup, what: str = "dimension") -> torch.Tensor:
    """``tp.rank``'s block of ``tensor`` along ``dim``, as a new contiguous tensor (no shared storage)."""
    index = shard_range(tensor.shape[dim], tp.rank, tp.world_size, what)
    return tensor.narrow(dim, index.start, index.stop - index.start).detach().clone().contiguous()


def unshard_dim(shards: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """The full tensor from every rank's block along ``dim``, in rank order (inverse of ``shard_dim``)."""
    return torch.cat(list(shards), dim=dim)


def _linear(module: nn.Module) -> nn.Linear:
    if not isinstance(module, nn.Linear):
        raise TypeError(
            f"only an nn.Linear can be sharded into a parallel linear layer, not {type(module).__name__}"
        )
    return module


def _bias(tensor: torch.Tensor | None) -> nn.Parameter | None:
    return None if tensor is None else nn.Parameter(tensor, requires_grad=False)


class ColumnParallelLinear(nn.Module):
    """This rank's block of a Linear's output features: ``y_local = x @ W[block].T + b[block]``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, tp: TPGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = _bias(bias)
        self.rank, self.world_size = tp.rank, tp.world_size

    @classmethod
    def from_full(cls, full: nn.Module, tp: TPGroup, what: str = "output features") -> ColumnParallelLinear:
        full = _linear(full)
        bias = shard_dim(full.bias, 0, tp, what) if full.bias is not None else None
        return cls(shard_dim(full.weight, 0, tp, what), bias, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        out_local, in_features = self.weight.shape
        return f"in={in_features}, out={out_local} of {out_local * self.world_size}, rank={self.rank}"


class RowParallelLinear(nn.Module):
    """This rank's block of a Linear's input features; the partial products are summed over the group.

    ``group`` None (a simulated rank, see ``TPGroup``) returns the partial product without the bias.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, tp: TPGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = _bias(bias)
        self.group: Any = tp.group
        self.rank, self.world_size = tp.rank, tp.world_size

    @classmethod
    def from_full(cls, full: nn.Module, tp: TPGroup, what: str = "input features") -> RowParallelLinear:
        full = _linear(full)
        bias = full.bias.detach().clone() if full.bias is not None else None
        return cls(shard_dim(full.weight, 1, tp, what), bias, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight)
        if self.group is None:
            return partial if self.world_size > 1 or self.bias is None else partial + self.bias
        y = all_reduce_sum(partial, self.group)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        out_features, in_local = self.weight.shape
        return f"in={in_local} of {in_local * self.world_size}, out={out_features}, rank={self.rank}"
